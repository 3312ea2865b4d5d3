"""BlitzScale live scaling (§4, §5.2) in the simulator: layer-level cooperative execution.

In: a multicast receiver the loading state machine declared live (`GoLive`), how many layers
it holds at any moment (its longest block prefix), the seconds per layer its blocks took to
land so far, and the pool whose loaded instances it helps. Each look builds a `LiveView`
(the sources with what is on or on its way to them, the requests that have not started — the
router's queue and the sources' queues; the policy takes the router's and the partner's,
oldest first, BlitzScale §5.2 step (1), `takes_from` —, the sources' admission times for
the drain rate, the cost model's prefill seconds per token) and carries out what the target's
`policy.blitzscale.live_scaling.LiveScalingState.look` returns, as `surge serve` does
(`runtime/scaleout/live.py`): a declined look or a zigzag batch waiting for its layers looks
again `LOOK_INTERVAL_S` later (the policy's, both bodies'); a `RunBatch` runs its first T
layers on the new instance (the *target*, inst.1) and the remaining S = L - T on the source
(inst.0, the overloaded instance it pairs with, `live_pair.pair_with`, §5.2; under P/D a
prefill instance: `cooperating`; the pool's other targets' partners are not free), at the
times the cost model gives;
the request's first token comes when the source finishes, then it decodes there (or, under
P/D, hands its KV cache to a decode instance as any prefill). C2 is carried out, not
assumed: a batch reaches the source only when the target has finished its T layers and the
activation has crossed the network (a flow that shares links with the multicast), and the
source runs its S layers as a step of their own, after the live batches that reached it
first and before its own requests (`policy.blitzscale.live_step.next_step`, Eq. 1: "executed
in a FIFO order"; `sim/batching.py` carries it out). The target executes one batch at a time and
takes the next while the source runs the last (Fig. 12b), up to `LiveSettings.max_in_flight`
batches under way (started, first token not back), as the runtime's batch tasks are. A
zigzag batch waiting for layers is looked at again when the block that brings them lands
(`landed`, §5.2 (2) preemption), not only at the poll. It is not a router endpoint until it
holds every layer (then `Loader.ready` serves it alone and `redistribute` sends the sources'
unstarted requests back through the router, `policy.blitzscale.live_scaling.redistributed`,
§5.2 step 3).

Not modelled: the K/V of the target's T layers travelling to the source (the runtime's
`live_prefill` sends it; the activation crossing is modelled and is the larger part for
short prompts).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass

from surge.events import LiveBatch, ModeSwitch
from surge.policy.blitzscale.live_pair import LiveSource, Waiting, redirect_order
from surge.policy.blitzscale.live_scaling import (
    LOOK_INTERVAL_S,
    LiveScalingState,
    LiveSettings,
    LiveView,
    RunBatch,
    redistributed,
)
from surge.policy.blitzscale.pd import DECODE
from surge.policy.blitzscale.slo_check import drain_rate_per_s
from surge.policy.blitzscale.zigzag import ZigzagProblem
from surge.sim.events import Priority
from surge.sim.instance import Instance
from surge.sim.pools import Pool, Requests
from surge.sim.request import SimRequest
from surge.sim.world import World

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
    source_role: str | None = None
    """The source's P/D role when the batch started (None: no P/D): prefill under P/D
    (`policy.blitzscale.live_scaling.cooperating`), so the batch's requests are handed to
    a decode instance (a source mutated meanwhile keeps them,
    `policy.blitzscale.handoff.decodes_where_prefilled`)."""


class _Target:
    """One live target's state."""

    def __init__(
        self,
        pool: Pool,
        inst: Instance,
        held_layers: Callable[[], int],
        layer_load_s: Callable[[], float | None],
        state: LiveScalingState,
    ) -> None:
        self.pool = pool
        self.inst = inst
        self.held_layers = held_layers
        self.layer_load_s = layer_load_s
        self.state = state
        self.busy = False
        self.live = True
        self.batches: list[list[SimRequest]] = []
        """Its batches under way (first token not back yet)."""
        self.poll_due = False
        """A later look is scheduled already."""

    def in_flight(self) -> int:
        """Batches started whose first token has not come back."""
        self.batches = [b for b in self.batches if any(r.first_token_s < 0 for r in b)]
        return len(self.batches)


class LiveScaling:
    """Live targets of every pool and their cooperative batches."""

    def __init__(self, world: World, requests: Requests) -> None:
        self.world = world
        self.requests = requests
        self.targets: dict[int, _Target] = {}
        self.was_live: set[int] = set()

    # --- entry points -------------------------------------------------------------
    def go_live(
        self,
        pool: Pool,
        inst: Instance,
        held_layers: Callable[[], int],
        layer_load_s: Callable[[], float | None],
    ) -> None:
        """`inst` may serve cooperatively (`GoLive`); `held_layers()` says how many of its
        first layers it holds now, `layer_load_s()` the seconds per layer its blocks took
        to land so far (`policy.blitzscale.live_scaling.layer_load_s`)."""
        if inst.id in self.targets or inst.released:
            return
        world = self.world
        settings = LiveSettings(
            num_layers=inst.cost.num_layers,
            live_batch=world.system.live_batch,
            fallback_load_ratio=world.system.live_load_ratio,
            decode_partners=world.system.live_decode_partners,
            least_loaded=world.system.live_least_loaded,
            ttft_slo_s=world.settings.slo_of(world.models[pool.model].name).ttft_s,
        )
        state = LiveScalingState(settings)
        self.targets[inst.id] = _Target(pool, inst, held_layers, layer_load_s, state)
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
        go back through the router (`redistributed`), which spreads them over every
        instance (§5.2 (3))."""
        if inst.id not in self.was_live:
            return
        self.was_live.discard(inst.id)
        queued = [
            (old, r)
            for old in pool.instances
            if old is not inst and old.serving and not old.released
            for r in old.waiting
            if r.skip_layers == 0 and r.generated == 0
        ]
        view = [Waiting(r.arrival_s, r.prefill_tokens, old.id) for old, r in queued]
        moved = [queued[i][1] for i in redistributed(view)]
        for old in {o for o, _ in queued}:
            old.remove_waiting({r.id for r in moved})
        if moved:
            self.requests.requeue(pool, moved)

    def landed(self, iid: int) -> None:
        """A block landed on instance `iid`: if it is a live target whose pending zigzag
        batch waited for the layers it brings, look again now (§5.2 (2) preemption)."""
        t = self.targets.get(iid)
        if t is not None and not t.busy and t.state.wakes(t.held_layers()):
            self.world.result.live_woken += 1
            self._step(iid)

    # --- one step -----------------------------------------------------------------
    def _later(self, iid: int, delay_s: float) -> None:
        t = self.targets.get(iid)
        if t is None or t.poll_due:
            return
        t.poll_due = True

        def poll() -> None:
            t.poll_due = False
            self._step(iid)

        self.world.loop.schedule(self.world.loop.now_s + delay_s, Priority.INSTANCE, iid, poll)

    def _sources(self, t: _Target) -> list[Instance]:
        return [
            i
            for i in t.pool.instances
            if i is not t.inst and i.loaded and i.serving and not i.released
        ]

    def _waiting(self, t: _Target, sources: list[Instance]) -> list[tuple[SimRequest, int | None]]:
        """Requests that have not started, each with where it waits (None: the router's
        queue; else the source's id): the router's queue, then the sources' queues."""
        out: list[tuple[SimRequest, int | None]] = [
            (r, None) for r in t.pool.queue if r.generated == 0 and not r.recompute
        ]
        for s in sources:
            out.extend((r, s.id) for r in s.waiting if r.skip_layers == 0 and r.generated == 0)
        return out

    def _view(
        self, t: _Target, sources: list[Instance], waiting: list[tuple[SimRequest, int | None]]
    ) -> LiveView:
        """The target and its pool as `LiveScalingState.look` sees them now."""
        now = self.world.loop.now_s
        queued = tuple(Waiting(r.arrival_s, r.prefill_tokens, at) for r, at in waiting)
        first = sum(
            queued[i].prompt_tokens for i in redirect_order(queued)[: self.world.system.live_batch]
        )
        # The cost model is what a source's prefill takes here: its seconds per token.
        per_token = t.inst.cost.prefill_s(first) / first if first > 0 else None
        admitted = sorted(a for s in sources for a in s.admitted_s)
        return LiveView(
            now_s=now,
            held_layers=t.held_layers(),
            sources=tuple(
                # under P/D only prefill instances cooperate (`cooperating`, §5.2), as the
                # runtime's view says
                LiveSource(i.id, i.outstanding + i.reserved, prefills=i.role != DECODE)
                for i in sources
            ),
            waiting=queued,
            layer_load_s=t.layer_load_s(),
            prefill_s_per_token=per_token,
            drain_per_s=drain_rate_per_s(admitted, now),
            in_flight=t.in_flight(),
            paired_elsewhere=self._paired_elsewhere(t),
        )

    def _paired_elsewhere(self, t: _Target) -> frozenset[int]:
        """The partners of the pool's other live targets (§5.2: one per overloaded
        instance)."""
        return frozenset(
            o.state.partner
            for o in self.targets.values()
            if o is not t and o.pool is t.pool and o.state.partner is not None
        )

    def _step(self, iid: int) -> None:
        t = self.targets.get(iid)
        if t is None or t.busy or t.inst.released:
            return
        sources = self._sources(t)
        waiting = self._waiting(t, sources)
        view = self._view(t, sources, waiting)
        action = t.state.look(view)
        if not isinstance(action, RunBatch):  # declined, or zigzag waits for its layers
            self._later(iid, LOOK_INTERVAL_S)
            return
        num_layers = t.inst.cost.num_layers
        split = action.split
        batch = [waiting[i][0] for i in action.take]
        source = next(i for i in sources if i.id == action.source)
        self._take(t, batch, sources)
        now = self.world.loop.now_s
        key = len(self.world.result.live_batches)
        self.world.result.live_batches.append(
            LiveRecord(
                now,
                t.inst.id,
                source.id,
                (split, num_layers - split),
                action.planned_split,
                view.held_layers,
                action.problem,
                action.index,
                action.schedule,
                tuple(r.id for r in batch),
                source.role,
            )
        )
        t.busy = True
        t.batches.append(batch)
        # its partner's load from now on (the router's room, the autoscaler's and the P/D
        # views), as the runtime's `LocalEndpoint.live` from the batch's start: its last
        # layers will run there. Until 2026-11-29 only once its activation arrived: on the
        # emulated §6.1 7B scenario the router saw room on the partner while batch 15-18's
        # first 13 layers ran (1.687-1.81 s) and gave it 19 and 25-28, which the runtime
        # kept for the next instance (node 2 at 2.084).
        source.reserved += len(batch)
        tokens = sum(r.prefill_tokens for r in batch)
        run_s = t.inst.cost.prefill_s(tokens, split)
        done = functools.partial(self._target_done, t, source, split, batch, tokens, key)
        self.world.loop.schedule(now + run_s, Priority.INSTANCE, t.inst.id, done)

    def _take(self, t: _Target, batch: list[SimRequest], sources: list[Instance]) -> None:
        ids = {r.id for r in batch}
        kept = [r for r in t.pool.queue if r.id not in ids]
        t.pool.queue.clear()
        t.pool.queue.extend(kept)
        for s in sources:
            s.remove_waiting(ids)

    def _target_done(
        self,
        t: _Target,
        source: Instance,
        split: int,
        batch: list[SimRequest],
        tokens: int,
        key: int,
    ) -> None:
        """The target ran its layers: the activation crosses to the source, which runs
        the rest as a step of its own, after the live batches that reached it first and
        before its own requests (C2, `policy.blitzscale.live_step`); the target takes its
        next batch. `key`: the batch's `live_batches` index."""
        world = self.world
        prof = world.models[t.pool.model].profile
        for r in batch:
            r.skip_layers = split
            r.live_batch = key
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
            source.reserved -= len(batch)  # in its engine from now on
            if source.released:  # the source went away: the batch starts over
                for r in batch:
                    r.skip_layers, r.live_batch = 0, -1
                self.requests.requeue(t.pool, list(batch))
            else:
                source.submit_many(batch)

        path = world.state.gpu_to_gpu(t.inst.gpus[0], source.gpus[0])
        world.net.start(path, tokens * prof.hidden_size * ACTIVATION_BYTES, arrived)
        if t.live:
            self._step(t.inst.id)
