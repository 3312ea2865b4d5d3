"""FlexPipe's runtime scale-out places a new pipeline as the simulator does (§7 Eq. 13,
`system.place_new_group`): the spare nodes that hosted the model most recently
(served it, or took a host copy: the controller's `host_last_used_s`) take its stages
first; without a history, Eq. 6 alone (the lowest free nodes). A placement that ignores
the history fails this test. With host groups, §7's HRG puts the stages on the fewest
hosts, away from hosts a recent scale-out loaded onto."""

import time
from dataclasses import replace
from types import SimpleNamespace

from surge.engine.sampling import SamplingParams
from surge.model.manifest import read_manifest
from surge.policy.flexpipe.hrg import ScalingMark
from surge.policy.multicast.topology import NodeLinks
from surge.policy.startup import Destination
from surge.policy.systems import serve_system
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.scaleout.context import ControllerHooks
from surge.runtime.scaleout.estimates import HOST_ESTIMATES
from surge.runtime.scaleout.flexpipe import choose_pipeline

SPARES = [1, 2, 3, 4, 5, 6]


def _ctx(manifest, hosted_s: dict[int, float], links=None, marks=()) -> SimpleNamespace:
    """A burst: arrivals in two clumps and a long queue, so the new pipeline is fine (with
    free hops: on loopback a tiny model loads in milliseconds, and the system's 1-ms hop
    per token would keep it coarse, `useful_stages`)."""
    now = time.monotonic()
    waiting = SimpleNamespace(params=SamplingParams(max_tokens=16))
    arrivals = [now - 5.0 + i * 0.001 for i in range(20)] + [now - 0.01 * i for i in range(20)]
    return SimpleNamespace(
        manifest=manifest,
        system=replace(serve_system("flexpipe"), stage_hop_s=0.0),
        server=SimpleNamespace(arrivals=sorted(arrivals), queue=[waiting] * 64, clock=REAL_CLOCK),
        fetch_gbps=10.0,
        estimates=HOST_ESTIMATES,
        ttft_slo_s=1.0,
        destinations=(Destination(0, "host", machine=0),),
        spares=tuple(Destination(n, "remote", machine=n) for n in SPARES),
        hosted_s=hosted_s,
        links=links or {},  # none: each node its own server (§7's HRG leaves Eq. 13 be)
        hooks=ControllerHooks(on_local=None, scaling_marks=lambda: marks),  # type: ignore[arg-type]
    )


def test_a_new_pipeline_takes_the_models_recent_hosts_first(tiny_store) -> None:
    manifest = read_manifest(tiny_store)
    plain = choose_pipeline(_ctx(manifest, {}), 0, SPARES)
    num_extra = plain.num_stages - 1
    assert num_extra >= 2, plain  # a burst: several stages beyond the destination's
    assert plain.slots == (0, *SPARES[:num_extra])  # Eq. 6 alone: the lowest free nodes
    now = time.monotonic()
    # Nodes 6, 5, 4, 3 hosted the model, 6 most recently, 3 longest ago (Eq. 13's decay).
    hosted = {6: now - 1.0, 5: now - 20.0, 4: now - 600.0, 3: now - 3000.0, 0: now - 1.0}
    placed = choose_pipeline(_ctx(manifest, hosted), 0, SPARES)
    assert placed.num_stages == plain.num_stages and placed.slots[0] == 0
    ranked = [6, 5, 4, 3, 1, 2]  # by Eq. 13's score, then the others by Eq. 6
    assert set(placed.slots[1:]) == set(ranked[:num_extra]), placed
    # Fewer past hosts than stages: they all take one, the lowest others the rest.
    placed = choose_pipeline(_ctx(manifest, {5: now - 20.0}), 0, SPARES)
    assert set(placed.slots[1:]) == {5, *SPARES[: num_extra - 1]}, placed


def test_host_groups_and_scaling_marks_steer_the_stages(tiny_store) -> None:
    # FlexPipe §7's HRG in surge serve: node 0 alone on its host, spares 1-2 on one host,
    # 3-4 on another, 5-6 on a third; a host just scaled onto (a mark) comes last.
    manifest = read_manifest(tiny_store)
    hosts = {0: "a", 1: "b", 2: "b", 3: "c", 4: "c", 5: "d", 6: "d"}
    links = {n: NodeLinks(host=h) for n, h in hosts.items()}
    plain = choose_pipeline(_ctx(manifest, {}, links), 0, SPARES)
    extra = plain.slots[1:]
    assert len(extra) >= 2, plain
    assert len({hosts[n] for n in extra}) == -(-len(extra) // 2)  # the fewest hosts
    marked = {hosts[n] for n in extra[:2]}
    marks = tuple(
        ScalingMark(min(n for n in hosts if hosts[n] == h), time.monotonic()) for h in marked
    )
    steered = choose_pipeline(_ctx(manifest, {}, links, marks), 0, SPARES)
    assert not {hosts[n] for n in steered.slots[1:3]} & marked, steered
