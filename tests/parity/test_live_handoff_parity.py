"""BlitzScale live scaling parity (§5.2, Fig. 12b): which of a live target's batches are *in
flight* (`LiveView.in_flight`, at most `LiveSettings.max_in_flight`): started, first tokens
not back. Once a batch's first tokens are back its requests are handed on — adopted by its
source, or under P/D their K/V sent to a decode instance, which may wait for room — and
the target may start the next batch while that goes on: the simulator's `_Target.in_flight`
counts a batch until its first tokens (its hand-off is the source engine's business), and
so must the runtime's `LiveScaling`.

Before 2026-11-29 the runtime counted a batch's task, which runs until its last hand-off:
on the emulated §6.1 7B run live batch 8-11's first tokens came at 1.682 s and its
hand-offs ended at 2.414, batch 12-14's at 2.151 and 2.325, so every look from 1.687 s
declined as busy until the target was whole (2.079 s): 2 batches of 7 requests, where the
simulator ran 4 of 15 (its third at 1.687 s, docs/emulation.md).

The scenario: one source (node 0), the target (node 2) holding `HELD` of `NUM_LAYERS`
layers, `NUM_WAITING` requests waiting past the TTFT SLO (three batches of
`SYSTEM.live_batch`). The first two batches start at once (the target runs batch 2's T
layers while the source runs batch 1's S); a look then declines (two in flight); batch 1's
first tokens come back while batch 2's do not, and the next look starts batch 3 — in the
runtime while batch 1's hand-off is still under way. The simulator runs its cost model in
virtual time; the runtime's looks are made by hand, its `live_prefill` stood in for (no
agents): it samples the first tokens when the test says the source is done, then hands on
until the test ends.

A batch's hand-off starts at its first tokens in both bodies: the simulator's engine parks
each request for a decode instance as its prefill step ends (`sim/batching.py`
`_on_prefill`); the runtime exports its K/V from both stages (`kv_export`), which waits
for a step of that stage, never for another live stage's (each has its own cache). Until
2026-11-29 a node's live stages shared one lock for both: batch 8-11's exports on its
partner waited for batch 12-14's step there, queued behind the partner's own prefill
(first tokens 1.682 s, second tokens 2.295-2.627 s on the emulated §6.1 run).

While a batch's last layers are on the partner its requests are the partner's load, not
queued: the simulator's engine holds them (its `outstanding`, the router's room and
`pool_load`); the runtime's `LocalEndpoint.live`. Until 2026-11-29 the runtime counted them
as queued and the partner as holding none, so its router gave the partner requests 15-18
at once (the simulator's, full, took 15 at 1.361 s and 16-19 at 1.68)."""

import asyncio
import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from surge.control.load_monitor import pool_load
from surge.engine.batch import BatchMeta
from surge.engine.hidden import hidden_to_bytes
from surge.events import NO_BUS
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.runtime.clock import REAL_CLOCK
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.node.serving import NO_CHARGES, AgentServing
from surge.runtime.protocol import KvExportOp, QueuedReply, StageOpenOp, StageStepOp
from surge.runtime.scaleout import ScaleOutReport
from surge.runtime.scaleout import live as runtime_live
from surge.sim.instance import Instance
from surge.sim.request import SimRequest
from surge.sim.scaling import pool_load as sim_pool_load
from surge.sim.simulator import Simulation
from tests.parity.conftest import FakeClient
from tests.parity.sim_world import entry_pool, instance_on, simulation

NUM_LAYERS = 8
HELD = 2
"""Layers the target holds (T <= HELD, so the source's S is the longer part)."""
SOURCE, TARGET = 0, 2
SYSTEM = replace(system_config("blitzscale"), pd_disaggregation=False, num_blocks=NUM_LAYERS)
NUM_WAITING = 3 * SYSTEM.live_batch
PROMPT_TOKENS = 16
WAITED_S = 100.0
"""How long the queue has waited: far past the TTFT SLO, so the §5.2 check asks for help
in both bodies whatever each measures."""
GPU_SPEEDUP = 0.01
"""The parity GPU slowed so that a batch's S layers take several of the target's polls
(`LOOK_INTERVAL_S`)."""

Batch = tuple[int, int, int, tuple[int, ...]]
"""(target node, source node, layers on the target, request ids)."""
Load = tuple[int, int]
"""The pool's load as the autoscaler sees it: requests queued, the source's outstanding."""


def _run_until_back(loop, req: SimRequest) -> None:
    """Run the simulator's loop, a millisecond at a time, until `req`'s first token."""
    for k in range(1, 10_000):
        loop.run(until_s=k * 0.001)
        if req.first_token_s >= 0:
            return
    raise AssertionError("the first batch's first tokens never came")


def _sim_live(tmp_path, pd: bool = False) -> tuple[Simulation, Instance, Instance, list]:
    """The scenario in the simulator, its target gone live (the first look): the
    simulation, the source, the target and the waiting requests; `pd`: the source a P/D
    prefill instance, a decode instance on node 1."""
    system = replace(SYSTEM, pd_disaggregation=pd)
    sim = simulation(
        tmp_path, system, TARGET + 1, "registry", (NUM_LAYERS,), gpu_speedup=GPU_SPEEDUP
    )
    pool = entry_pool(sim)
    source = instance_on(sim, SOURCE, serving=True)
    if pd:
        source.role = "prefill"
        instance_on(sim, 1, serving=True).role = "decode"
    target = instance_on(sim, TARGET, serving=False)
    now = sim.world.loop.now_s
    reqs = [SimRequest(i, 0, now - WAITED_S, PROMPT_TOKENS, 4) for i in range(NUM_WAITING)]
    pool.queue.extend(reqs)
    sim.loader.live.go_live(pool, target, lambda: HELD, lambda: None)
    return sim, source, target, reqs


def _sim_batches(tmp_path) -> tuple[list[Batch], list[Batch]]:
    """The simulator's batches when batch 1's first tokens come back, and a poll after."""
    sim, source, target, reqs = _sim_live(tmp_path)
    records = sim.world.result.live_batches
    loop = sim.world.loop
    machine = {source.id: SOURCE, target.id: TARGET}

    def log(before_s: float) -> list[Batch]:
        return [
            (machine[r.target], machine[r.source], r.split[0], r.request_ids)
            for r in records
            if r.start_s < before_s
        ]

    _run_until_back(loop, reqs[0])
    back_s = reqs[0].first_token_s
    loop.run(until_s=back_s + 1.5 * runtime_live.LOOK_INTERVAL_S)  # the next poll
    second = records[1].request_ids[0]
    assert reqs[second].first_token_s < 0, "batch 2 must still be in flight"
    return log(back_s), log(loop.now_s + 1.0)


class _Client(FakeClient):
    """The source's agent: it holds nothing queued (every request waits at the router)."""

    async def call_bytes(self, node: int, op) -> tuple[QueuedReply, memoryview]:
        return QueuedReply(()), memoryview(b"")


def _runtime_batches() -> tuple[list[Batch], list[Batch], list[Batch], Load]:
    """The runtime's batches after its first three looks (two batches, then one that
    declines), and after the look that follows batch 1's first tokens; and its pool's
    load (`pool_load`) between the two."""
    logged: list[Batch] = []
    tasks: list[asyncio.Task] = []
    sourced: list[asyncio.Event] = []
    """Per batch: its source is done (first tokens sampled)."""
    handed_on = asyncio.Event()
    """Every batch's hand-off ends (the test's end)."""
    now = REAL_CLOCK.now_s()
    queue = [
        SimpleNamespace(
            req_id=str(i),
            arrival_t=now - WAITED_S,
            prompt_token_ids=[1] * PROMPT_TOKENS,
            output_token_ids=[],
            done=asyncio.Event(),
        )
        for i in range(NUM_WAITING)
    ]
    client = _Client()
    ep = LocalEndpoint(client, SOURCE, "tiny", f"tiny-node{SOURCE}")  # type: ignore[arg-type]
    server = SimpleNamespace(
        endpoints={ep.name: ep},
        queue=queue,
        pd=None,
        prefill_spans=[],
        departures=[],
        clock=REAL_CLOCK,
    )
    server.take = lambda reqs: queue.__setitem__(slice(None), [r for r in queue if r not in reqs])
    blocks = [SimpleNamespace(first_layer=b, end_layer=b + 1) for b in range(NUM_LAYERS)]
    ctx = SimpleNamespace(
        model="tiny",
        server=server,
        manifest=SimpleNamespace(arch=SimpleNamespace(num_layers=NUM_LAYERS), blocks=blocks),
        system=SYSTEM,
        client=client,
        ttft_slo_s=Slo().ttft_s,
        events=NO_BUS,
        report=ScaleOutReport(),
    )

    async def live_prefill(server, manifest, new, old, t, batch, deliver, keep) -> None:
        logged.append((new, old.node, t, tuple(int(r.req_id) for r in batch)))
        tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        done = asyncio.Event()
        sourced.append(done)
        await done.wait()
        for r in batch:  # first tokens out, then each request is handed on
            r.output_token_ids.append(1)
        await handed_on.wait()

    live = runtime_live.LiveScaling(ctx, {TARGET: set(range(HELD))})  # type: ignore[arg-type]

    dep = SimpleNamespace(
        instances={
            SOURCE: SimpleNamespace(node=SOURCE, endpoint=ep, num_sending=0, idle_since_s=None)
        },
        requests={r.req_id: r for r in queue},
    )

    async def looks() -> tuple[list[Batch], list[Batch], list[Batch], Load]:
        live.go_live(TARGET)
        for _ in range(3):  # two batches, then two in flight
            await live.step()
            await asyncio.sleep(0)  # the batch's task starts
        two = list(logged)
        load = pool_load(dep, REAL_CLOCK.now_s())  # type: ignore[arg-type]
        sourced[0].set()  # batch 1's first tokens come back; its hand-off goes on
        for _ in range(3):
            await asyncio.sleep(0)
        before = list(logged)
        await live.step()
        await asyncio.sleep(0)
        after = list(logged)
        handed_on.set()
        for e in sourced:
            e.set()
        await asyncio.gather(*tasks)
        return two, before, after, (load.queued, load.instances[0].outstanding)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime_live, "live_prefill", live_prefill)
        return asyncio.run(looks())


def test_a_batch_handing_its_requests_on_is_not_in_flight(tmp_path) -> None:
    sim_before, sim_after = _sim_batches(tmp_path)
    runtime_two, runtime_before, runtime_after, _ = _runtime_batches()
    # two batches in flight: the third look declines in both bodies
    assert runtime_two == runtime_before == sim_before
    assert len(sim_before) == 2
    # batch 1's first tokens are back: the next look runs batch 3 (before 2026-11-29 the
    # runtime declined as busy while batch 1 handed its requests on)
    assert runtime_after == sim_after, f"runtime {runtime_after} vs simulator {sim_after}"
    assert [b[3] for b in sim_after] == [
        tuple(range(k * SYSTEM.live_batch, (k + 1) * SYSTEM.live_batch)) for k in range(3)
    ]


class _Runner:
    """A live stage's runner: no model; its step waits for `release` (the GPU busy)."""

    arch = SimpleNamespace(num_layers=NUM_LAYERS)
    manifest = SimpleNamespace(digest="d")

    def __init__(self, release: threading.Event | None = None) -> None:
        self.release = release

    def run_layers(self, first: int, end: int, hidden: torch.Tensor, batch: BatchMeta):
        if self.release is not None:
            self.release.wait(10.0)
        return hidden

    def logits(self, hidden: torch.Tensor, batch: BatchMeta) -> torch.Tensor:
        return torch.zeros(len(batch.q_lens), 4)

    def export_kv(self, seq_id: int, num_tokens: int) -> torch.Tensor:
        return torch.zeros(1, 2, num_tokens, 1, 1)


def _runtime_export_waits_for_next_batch() -> bool:
    """On the partner's agent: batch 2's stage steps (held on the GPU), batch 1's K/V is
    exported meanwhile; whether the export waited for batch 2's step."""
    store = SimpleNamespace(model=lambda name: SimpleNamespace(manifest=_Runner.manifest))
    serving = AgentServing(SimpleNamespace(pacer=None, node=SOURCE), store)  # type: ignore[arg-type]
    serving._charges = lambda model: NO_CHARGES  # type: ignore[method-assign]
    release = threading.Event()
    runners = {"live-1": _Runner(), "live-2": _Runner(release)}
    batch = BatchMeta((0,), (0,), (PROMPT_TOKENS,))
    activation = hidden_to_bytes(torch.zeros(1, PROMPT_TOKENS, 4), batch)

    async def send(header, payload, pace) -> None:
        pass

    conn = SimpleNamespace(send=send)

    async def run() -> bool:
        for name, runner in runners.items():  # two live batches' last stages, one group
            serving._stage_runner = lambda model, first, end, r=runner: r  # type: ignore[method-assign]
            op = StageOpenOp(name, "m", HELD, NUM_LAYERS, None, compute_group="live-m", digest="d")
            await serving.op_stage_open(op, None, memoryview(b""))  # type: ignore[arg-type]
        step = asyncio.create_task(
            serving.op_stage_step(
                StageStepOp(pipeline="live-2", kind="hidden"),
                conn,  # type: ignore[arg-type]
                memoryview(activation),
            )
        )
        while not serving.busy():  # batch 2's step holds the group
            await asyncio.sleep(0.01)
        export = serving.op_kv_export(
            KvExportOp("live-1", 0, PROMPT_TOKENS),
            conn,  # type: ignore[arg-type]
            memoryview(b""),
        )
        try:
            await asyncio.wait_for(export, 2.0)
            waited = False
        except TimeoutError:
            waited = True
        release.set()
        await step
        return waited

    return asyncio.run(run())


def _sim_parked_at_first_token(tmp_path) -> bool:
    """Under P/D, batch 1 on a prefill source: whether its requests park for a decode
    instance at their first tokens, while batch 2 is still in flight."""
    sim, _, _, reqs = _sim_live(tmp_path, pd=True)
    _run_until_back(sim.world.loop, reqs[0])
    second = sim.world.result.live_batches[1].request_ids[0]
    assert reqs[second].first_token_s < 0, "batch 2 must still be in flight"
    first = sim.world.result.live_batches[0].request_ids
    return all(reqs[i].parked_s == reqs[i].first_token_s for i in first)


def test_a_batch_hands_its_requests_on_at_its_first_tokens(tmp_path) -> None:
    assert _sim_parked_at_first_token(tmp_path)
    assert not _runtime_export_waits_for_next_batch(), (
        "batch 1's K/V export waited for batch 2's step on the partner"
    )


def _sim_load(tmp_path) -> Load:
    """The simulator's pool load once both batches' activations reached the source,
    before batch 1's first tokens."""
    sim, source, _, reqs = _sim_live(tmp_path)
    pool = entry_pool(sim)
    loop = sim.world.loop
    for k in range(1, 10_000):
        loop.run(until_s=k * 0.001)
        if pool.held(source) == 2 * SYSTEM.live_batch:  # both batches there
            break
    assert reqs[0].first_token_s < 0, "batch 1 must still be in flight"
    load = sim_pool_load(pool, loop.now_s)
    return load.queued, load.instances[0].outstanding


def test_a_live_batch_on_its_partner_is_the_partners_load_not_queued(tmp_path) -> None:
    """The requests of the batches whose last layers run on the partner count as its load
    (the router's room, the autoscaler's and the P/D monitor's views), not as queued: the
    simulator's engine holds them. Before 2026-11-29 the runtime counted them as queued at
    the router (ongoing requests on no endpoint) and the partner as holding none."""
    _, _, _, runtime = _runtime_batches()
    sim = _sim_load(tmp_path)
    assert runtime == sim == (NUM_WAITING - 2 * SYSTEM.live_batch, 2 * SYSTEM.live_batch)


def _sim_load_at_start(tmp_path) -> Load:
    """The simulator's pool load as batch 2 starts, before batch 1's activation reaches
    the source (batch 1's T layers done, its activation crossing)."""
    sim, source, _, _ = _sim_live(tmp_path)
    records = sim.world.result.live_batches
    loop = sim.world.loop
    for k in range(1, 100_000):
        loop.run(until_s=k * 1e-5)
        if len(records) == 2:
            break
    assert source.outstanding == 0, "batch 1's activation must still be on its way"
    load = sim_pool_load(entry_pool(sim), loop.now_s)
    return load.queued, load.instances[0].outstanding


def test_a_live_batch_is_its_partners_load_from_its_start(tmp_path) -> None:
    """A batch's requests are its partner's load from the batch's start (its last layers
    will run there), while the target runs its first layers and the activation crosses:
    the runtime's `LocalEndpoint.live` from `_run_batch`'s start. Before 2026-11-29 the
    simulator counted them only once the activation arrived (until then on no instance and
    not queued): on the emulated §6.1 7B scenario its router saw room on the partner while
    batch 15-18's first 13 layers ran (1.687-1.81 s) and gave it requests 19 and 25-28,
    which the runtime kept at the router for the next instance (node 2, 2.084 s)."""
    _, _, _, runtime = _runtime_batches()
    sim = _sim_load_at_start(tmp_path)
    assert runtime == sim == (NUM_WAITING - 2 * SYSTEM.live_batch, 2 * SYSTEM.live_batch)
