"""Handing one scale-out to the runtime: what the controller knows, in the runtime's terms.

What flows: the autoscaler (`control/autoscaler.py`) has placed destinations for a
deployment; `start_scale_out` turns the parameter pool into the start-up question of
`policy.startup` (`startup_request`: each destination's own tier, the complete GPU and host
copies elsewhere), adds the SLOs and link speed ParaServe's Alg. 1/2 need and the
controller's side (`ScaleOutOffer.side`, a `DeploymentSide`), builds the frozen
`ScaleOutContext` (with the nodes whose own device copy a host mate may open,
`device_owners`) and awaits `surge.runtime.scaleout.run_scale_out`; what happened is
written on the `ScaleOutReport` the caller passed in (filled even when it fails part way).
The simulator asks the same start-up question (`sim/loading.Loader.startup_request`).
Owned by control/.
"""

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from surge.config import EngineConfig
from surge.control.pool import ParameterPool
from surge.control.state import Deployment
from surge.events import NO_BUS, EventBus
from surge.policy.multicast.group_block_bound import GroupBlockBound
from surge.policy.multicast.topology import NodeLinks
from surge.policy.startup import Copy, Destination, StartupRequest
from surge.policy.systems import SystemConfig
from surge.runtime.client import ClusterClient
from surge.runtime.scaleout import ControllerSide, ScaleOutContext, ScaleOutReport, run_scale_out
from surge.runtime.scaleout.estimates import HOST_ESTIMATES, ServingEstimates


@dataclass(frozen=True)
class ScaleOutOffer:
    """What the controller offers one scale-out of a deployment (see `start_scale_out`):
    its side of the hand-over, and the facts the runtime plans with."""

    side: ControllerSide
    """What only the controller can do, called back by the runtime (`DeploymentSide`)."""
    spares: tuple[int, ...]
    """Live nodes other than the destinations with a free slot and no instance of it."""
    nic_load: dict[int, int]
    """Other scale-outs each node's NIC takes part in now (network contention)."""
    link_gbps: float | None
    """Per-node link cap of the agents, Gbit/s (None: unknown or uncapped)."""
    events: EventBus = NO_BUS
    """Where the scale-out publishes what it does (the dashboard's stream)."""
    links: Mapping[int, NodeLinks] = field(default_factory=dict)
    """Each agent's reported links (caps, host group): the multicast planner's topology."""
    estimates: ServingEstimates = HOST_ESTIMATES
    """Compute and fetch rates assumed before measuring (`control/emulation.py`)."""
    paced_setups: bool = False
    """Engine starts (`init_s`) and gloo group creations (`group_setup_s`) paced on the
    serving clock (under GPU-time emulation: `ScaleOutContext.paced_setups`)."""
    group_block_bound: GroupBlockBound = field(default_factory=GroupBlockBound)
    """A gloo group member's wait for one block (`ControllerConfig.group_block_bound`)."""


def startup_request(
    system: SystemConfig,
    pool: ParameterPool,
    model: str,
    dests: list[int],
    outstanding: dict[int, int],
    live: set[int],
    busy: frozenset[int] | set[int] = frozenset(),
    sending: Mapping[int, int] | None = None,
    loading: Collection[int] = (),
    host_sending: Mapping[int, int] | None = None,
) -> StartupRequest:
    """What `policy.startup` is asked for `dests`: each one's own best tier (host, disk,
    none), and every complete copy on another live node — its GPU copy (with the load of
    the instance holding it, whether its egress carries P/D K/V: `busy`, and the
    multicasts it is a source of now: `sending`, which `sources_by_bandwidth` systems rank
    by) and its host copy; a node is its own machine, so the policy sends from one of
    them. `loading`: nodes whose instance receives a multicast now, offered as chain tails
    (tier `loading`: they forward blocks as they land; only `sources_by_bandwidth` systems
    take them). `host_sending`: multicasts each node's host copy is a source of now. Every
    copy of a node leaves by the node's one link (`Copy.egress`; BlitzScale §5.1 Alg. 1's
    `CurrentBW_s` is the link's). The simulator asks the same question
    (`sim/loading.Loader.startup_request`)."""
    sending = sending or {}
    gpu, host = set(pool.complete(model, "gpu")), set(pool.complete(model, "host"))
    others = [n for n in sorted(gpu | host) if n not in dests and n in live]
    copies = [
        Copy(
            n,
            "gpu",
            outstanding.get(n, 0),
            machine=n,
            busy_egress=n in busy,
            sending=sending.get(n, 0),
            egress=_link(n),
        )
        for n in others
        if n in gpu
    ]
    held = host_sending or {}
    copies += [
        Copy(n, "host", machine=n, sending=held.get(n, 0), egress=_link(n))
        for n in others
        if n in host
    ]
    tails = sorted(n for n in loading if n not in dests and n in live and n not in gpu)
    copies += [
        Copy(n, "loading", outstanding.get(n, 0), n, sending=sending.get(n, 0), egress=_link(n))
        for n in tails
    ]
    return StartupRequest(system, own_tiers(pool, model, dests), tuple(copies))


def _link(node: int) -> str:
    """The egress link of `node`'s copies: an agent is a machine with one NIC."""
    return f"node/{node}"


def device_owners(pool: ParameterPool, model: str, live: set[int]) -> tuple[int, ...]:
    """Live nodes holding a complete device copy of `model` of their own (not one mapped
    from a host mate, `ParameterPool.shared_from`): the copies `policy.copies.mate_copies` opens."""
    mapped = pool.shared_from.get(model, {})
    return tuple(n for n in pool.complete(model, "gpu") if n in live and n not in mapped)


def own_tiers(pool: ParameterPool, model: str, nodes: list[int]) -> tuple[Destination, ...]:
    """Each node as a destination with its own best complete copy (host, disk or none)."""
    host, disk = set(pool.complete(model, "host")), set(pool.complete(model, "disk"))
    return tuple(
        Destination(n, "host" if n in host else "disk" if n in disk else "remote", machine=n)
        for n in nodes
    )


async def start_scale_out(
    client: ClusterClient,
    pool: ParameterPool,
    dep: Deployment,
    dests: list[int],
    offer: ScaleOutOffer,
    *,
    engine: EngineConfig,
    timeout_s: float,
    serve_while_loading: bool,
    report: ScaleOutReport,
) -> None:
    """Bring `dests` up as local instances of `dep` by its system; fills `result`.

    Hands `surge.runtime.scaleout` the facts it plans with: the start-up question
    (`startup_request`), the SLOs in seconds (`SloSpec.seconds`: unset ones at the policy's
    defaults), the link speed and NIC load (ParaServe Alg. 1/2), each agent's
    reported links and what each egress carries (the multicast's topology), and the offer's
    hooks (a ParaServe group books spare slots and releases unused ones)."""
    system = dep.spec.system
    live = set(client.addresses) - client.down
    outstanding = {i.node: i.endpoint.outstanding for i in dep.instances.values() if i.endpoint}
    busy = {n for n, t in offer.side.traffic().items() if t.outgoing > 0}
    sending = {i.node: i.num_sending for i in dep.instances.values()}
    tails = {i.node for i in dep.instances.values() if i.receiving and i.endpoint is None}
    question = startup_request(
        system,
        pool,
        dep.name,
        dests,
        outstanding,
        live,
        busy,
        sending,
        loading=tails,
        host_sending=dep.host_sending,
    )
    slo = dep.spec.slo.seconds()
    ctx = ScaleOutContext(
        client=client,
        server=dep.server,
        manifest=dep.manifest,
        system=system,
        destinations=question.destinations,
        hooks=offer.side,
        copies=question.copies,
        engine=engine,
        timeout_s=timeout_s,
        serve_while_loading=serve_while_loading,
        spares=own_tiers(pool, dep.name, list(offer.spares)),
        fetching=dict(offer.nic_load),
        ttft_slo_s=slo.ttft_s,
        tpot_slo_s=slo.tpot_s,
        fetch_gbps=offer.link_gbps or offer.estimates.fetch_gbps,
        estimates=offer.estimates,
        paced_setups=offer.paced_setups,
        events=offer.events,
        links=offer.links,
        device_owners=device_owners(pool, dep.name, live),
        hosted_s=dict(dep.host_last_used_s),
        host_blocks={
            n: frozenset(pool.blocks_at(dep.name, n, "host")) for n in (*dests, *offer.spares)
        },
        group_block_bound=offer.group_block_bound,
        report=report,
    )
    await run_scale_out(ctx)


async def first_endpoint_s(dep: Deployment, t0_s: float, poll_s: float = 0.005) -> float:
    """Seconds from `t0_s` until an endpoint not there at the start serves `dep` (a
    pipeline or a local instance): the scale-out's first-endpoint phase (`t0_s` and the
    result on the deployment's clock; `poll_s` real)."""
    before = set(dep.server.endpoints)
    while not set(dep.server.endpoints) - before:
        await asyncio.sleep(poll_s)
    return dep.server.clock.now_s() - t0_s
