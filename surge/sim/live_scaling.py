"""BlitzScale live scaling (§4, §5.2) in the simulator: layer-level cooperative execution.

In: a multicast receiver the loading state machine declared live (`GoLive`), how many
layers it holds at any moment (its longest block prefix), when its multicast started,
and the pool whose overloaded instances it helps. Out: batches of queued requests whose
prefill runs its first T_i layers on the new instance (the *target*, inst.1) and the
remaining S_i = L − T_i on a loaded instance (the *source*, inst.0), at the times the
cost model gives; the request's first token comes when the source finishes, then it
decodes there (or, under P/D, hands its KV cache to a decode instance as any prefill).

The schedule is the runtime's (`runtime/scaleout/live.py`): `live_batch` requests per
batch, a (T_i, S_i) per batch from `surge.policy.blitzscale.zigzag` for the batches waiting when a
schedule starts (the ILP of Eq. 1 when it beats best effort, else best effort:
`policy.live_scaling.choose_schedule`, the runtime's choice too), T_i clipped to the
layers the target holds when it starts the batch and to L − 1. Time_l of Eq. 1 is
measured on this scale-out: seconds per layer landed so far over the cost model's
seconds to run one layer of the batch. C2 is carried out, not assumed: a batch reaches
the source only when the target has finished its T_i layers and the activation has
crossed the network (a flow that shares links with the multicast), and the source runs
it FIFO after what it already has. The target executes one batch at a time; it is not a
router endpoint until it holds every layer (then `Loader.ready` serves it alone and
`redistribute` spreads the sources' unstarted requests over both, §5.2 step 3).

Not modelled: the K/V of the target's T_i layers travelling to the source (the runtime's
`live_prefill` sends it; the activation crossing is modelled and is the larger part for
short prompts), the §5.2 SLO check on whether to live-scale (every live target helps).
"""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from surge.events import LiveBatch, ModeSwitch
from surge.policy.blitzscale.live_scaling import choose_schedule
from surge.policy.blitzscale.zigzag import ZigzagProblem, ZigzagSchedule
from surge.sim.events import Priority
from surge.sim.instance import Instance
from surge.sim.pools import Pool, Requests
from surge.sim.request import SimRequest
from surge.sim.world import World

POLL_S = 0.01
"""How often an idle live target looks at the queue again (virtual seconds)."""
ACTIVATION_BYTES = 2
"""Bytes per hidden value of the activation sent from target to source (fp16)."""


@dataclass(frozen=True)
class LiveRecord:
    """One cooperatively executed batch (`SimResult.live_batches`)."""

    start_s: float
    """When the target started its T layers."""
    target: int
    """The new instance's id."""
    source: int
    """The loaded instance that ran the rest."""
    split: tuple[int, int]
    """(T, S) this batch ran: layers on the target, then on the source."""
    planned_split: tuple[int, int]
    """(T_i, S_i) the zigzag schedule gave it before clipping to the layers held."""
    held_layers: int
    """Layers the target held when it started the batch."""
    problem: ZigzagProblem
    """The Eq. 1 problem its schedule solved (Time_l measured on this scale-out)."""
    index: int
    """Its batch's position in that schedule."""
    policy: str
    """`zigzag` or `best_effort`."""
    request_ids: tuple[int, ...]


class _Target:
    """One live target's state."""

    def __init__(
        self, pool: Pool, inst: Instance, held_layers: Callable[[], int], started_s: float
    ) -> None:
        self.pool = pool
        self.inst = inst
        self.held_layers = held_layers
        self.started_s = started_s
        self.splits: list[tuple[int, int]] = []
        self.schedule: ZigzagSchedule | None = None
        self.problem: ZigzagProblem | None = None
        self.busy = False
        self.live = True


class LiveScaling:
    """Live targets of every pool and their cooperative batches."""

    def __init__(self, world: World, requests: Requests) -> None:
        self.world = world
        self.requests = requests
        self.targets: dict[int, _Target] = {}
        self.was_live: set[int] = set()

    # --- entry points -------------------------------------------------------------
    def go_live(
        self, pool: Pool, inst: Instance, held_layers: Callable[[], int], started_s: float
    ) -> None:
        """`inst` may serve cooperatively (`GoLive`); `held_layers()` says how many of its
        first layers it holds now; its multicast started at `started_s`."""
        if inst.id in self.targets or inst.released:
            return
        self.targets[inst.id] = _Target(pool, inst, held_layers, started_s)
        self.was_live.add(inst.id)
        name = self.world.models[pool.model].name
        self.world.publish(ModeSwitch, model=name, node=inst.machine, mode="live")
        self._step(inst.id)

    def go_local(self, inst: Instance) -> None:
        """`inst` holds every layer: it takes no new cooperative batch (the one in
        flight finishes)."""
        t = self.targets.pop(inst.id, None)
        if t is not None:
            t.live = False

    def redistribute(self, pool: Pool, inst: Instance) -> None:
        """A former live target serves alone: the sources' requests that have not started
        go back through the router, which spreads them over every instance (§5.2 (3))."""
        if inst.id not in self.was_live:
            return
        self.was_live.discard(inst.id)
        moved: list[SimRequest] = []
        for old in pool.instances:
            if old is not inst and old.serving and not old.released:
                moved.extend(old.take_waiting(len(old.waiting)))
        if moved:
            moved.sort(key=lambda r: r.arrival_s)
            self.requests.requeue(pool, moved)

    # --- one step -----------------------------------------------------------------
    def _later(self, iid: int, delay_s: float) -> None:
        at = self.world.loop.now_s + delay_s
        self.world.loop.schedule(at, Priority.INSTANCE, iid, lambda: self._step(iid))

    def _sources(self, t: _Target) -> list[Instance]:
        return [
            i
            for i in t.pool.instances
            if i is not t.inst and i.loaded and i.serving and not i.released
        ]

    def _waiting(self, t: _Target, sources: list[Instance]) -> list[SimRequest]:
        """Requests that have not started: the router's queue, then the sources' queues."""
        out = [r for r in t.pool.queue if r.generated == 0 and not r.recompute]
        for s in sources:
            out.extend(r for r in s.waiting if r.skip_layers == 0 and r.generated == 0)
        return out

    def _step(self, iid: int) -> None:
        t = self.targets.get(iid)
        if t is None or t.busy or t.inst.released:
            return
        sys = self.world.system
        sources = self._sources(t)
        waiting = self._waiting(t, sources)
        held = t.held_layers()
        num_layers = t.inst.cost.num_layers
        if not sources or not waiting or held < 1:
            self._later(iid, POLL_S)
            return
        batch = waiting[: sys.live_batch]
        if not t.splits:  # a fresh schedule for the batches waiting now
            t.problem = ZigzagProblem(
                num_layers=num_layers,
                load_ratio=self._load_ratio(t, held, batch),
                num_batches=max(1, math.ceil(len(waiting) / sys.live_batch)),
                resident_layers_at_start=min(held, num_layers),
            )
            t.schedule = choose_schedule(t.problem)
            t.splits = list(t.schedule.splits)
        assert t.schedule is not None and t.problem is not None
        index = len(t.schedule.splits) - len(t.splits)
        planned = t.splits.pop(0)
        split = min(planned[0], held, num_layers - 1)
        if split < 1:  # this batch runs on the source alone (normal routing)
            self._later(iid, POLL_S)
            return
        source = min(sources, key=lambda i: (i.outstanding + i.reserved, i.id))
        self._take(t, batch, sources)
        now = self.world.loop.now_s
        self.world.result.live_batches.append(
            LiveRecord(
                now,
                t.inst.id,
                source.id,
                (split, num_layers - split),
                planned,
                held,
                t.problem,
                index,
                t.schedule.policy,
                tuple(r.id for r in batch),
            )
        )
        t.busy = True
        tokens = sum(r.prefill_tokens for r in batch)
        run_s = t.inst.cost.prefill_s(tokens, split)
        done = functools.partial(self._target_done, t, source, split, batch, tokens)
        self.world.loop.schedule(now + run_s, Priority.INSTANCE, t.inst.id, done)

    def _take(self, t: _Target, batch: list[SimRequest], sources: list[Instance]) -> None:
        ids = {r.id for r in batch}
        kept = [r for r in t.pool.queue if r.id not in ids]
        t.pool.queue.clear()
        t.pool.queue.extend(kept)
        for s in sources:
            s.remove_waiting(ids)

    def _target_done(
        self, t: _Target, source: Instance, split: int, batch: list[SimRequest], tokens: int
    ) -> None:
        """The target ran its layers: the activation crosses to the source, which runs
        the rest FIFO (C2); the target takes its next batch."""
        world = self.world
        prof = world.models[t.pool.model].profile
        for r in batch:
            r.skip_layers = split
        t.busy = False
        name = world.models[t.pool.model].name
        world.publish(
            LiveBatch,
            model=name,
            new_node=t.inst.machine,
            old_node=source.machine,
            split_layer=split,
            num_requests=len(batch),
        )

        def arrived() -> None:
            if source.released:  # the source went away: the batch starts over
                for r in batch:
                    r.skip_layers = 0
                self.requests.requeue(t.pool, list(batch))
            else:
                source.submit_many(batch)

        path = world.state.gpu_to_gpu(t.inst.gpus[0], source.gpus[0])
        world.net.start(path, tokens * prof.hidden_size * ACTIVATION_BYTES, arrived)
        if t.live:
            self._step(t.inst.id)

    def _load_ratio(self, t: _Target, held: int, batch: list[SimRequest]) -> float:
        """Eq. 1's Time_l on this scale-out: seconds per layer landed so far over the
        seconds the target takes to run one layer of `batch`."""
        per_layer_load_s = (self.world.loop.now_s - t.started_s) / max(held, 1)
        tokens = sum(r.prefill_tokens for r in batch)
        per_layer_exec_s = t.inst.cost.prefill_s(tokens, 1)
        return max(per_layer_load_s / per_layer_exec_s, 1e-3)
