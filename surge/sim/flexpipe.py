"""FlexPipe's groups (`surge.policy.flexpipe.system`): stage count, stages, slots, refactoring.

In: a pool's scale-out of a FlexPipe system (`shape`) and every autoscaler check
(`retune`). Out: the workers and bytes of a new group (one GPU per stage: stages chosen
by §6.1's granularity from the arrivals' CV, layers cut by §5's partition, GPUs chosen by
§6.2's slot allocation, on the machine §7 Eq. 13's affinity picks among those that hosted
the model when the stages fit there), and, when the chosen granularity changes, in-flight
refactoring of serving groups (§6: layers and valid KV entries copied between GPUs as flows
while the group keeps serving, then it runs with the new stages and the freed GPUs go back).
`groups.Groups` fetches and serves what `shape` returns; `flexpipe_sizes` reads the model's
layer profile, byte sizes and load time from the world.
"""

from bisect import bisect_right
from collections.abc import Callable

from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.flexpipe.granularity import GranularityState, cv_of_arrivals
from surge.policy.flexpipe.groups import (
    GroupView,
    group_refactors,
    pipeline_autoscale,
    pipeline_target,
)
from surge.policy.flexpipe.hrg import HrgView, ScalingMark
from surge.policy.flexpipe.microbatch import flexpipe_micro_batches
from surge.policy.flexpipe.slot_allocation import HostingRecord, SlotState
from surge.policy.flexpipe.system import (
    Affinity,
    LayerProfile,
    StageChoice,
    arrivals_in_window,
    choose_num_stages,
    choose_stages,
    refactor,
    scale_out_num_stages,
    split_stages,
)
from surge.sim.events import Priority
from surge.sim.flexpipe_sizes import (
    decode_steps,
    group_load_s,
    layer_profile,
    slot_bytes,
    stage_bytes,
)
from surge.sim.gpus import Gpus
from surge.sim.instance import Instance
from surge.sim.placement import Placement
from surge.sim.pools import Pool
from surge.sim.world import KEY_STRIDE, World

Spans = tuple[tuple[int, tuple[int, int]], ...]
"""Per stage: (GPU, (first layer, end layer))."""


class FlexPipe:
    """Stage shaping and refactoring of FlexPipe groups (a no-op for other systems)."""

    def __init__(self, world: World, gpus: Gpus, on_idle: Callable[[Pool], None]) -> None:
        self.world = world
        self.gpus = gpus
        self.on_idle = on_idle
        """Asks the autoscaler to look at a pool again after its downscale delay: a group
        that was refactored while idle was busy (sending) at the check its emptying
        scheduled, and would otherwise be held until the next one."""
        flexpipe = world.system.group_sizing == "flexpipe"
        self.settings = world.system.flexpipe if flexpipe else None
        self.states: dict[int, GranularityState] = {}
        """Per pool: the granularity controller's state."""
        self.spans: dict[int, Spans] = {}
        """Per group endpoint: its stages."""
        self.refactoring: set[int] = set()
        self.last_decision_s: dict[int, float] = {}
        """Per pool: when the granularity controller last decided."""
        self.pending: set[int] = set()
        """Pools with a re-decision scheduled (a quiet pool still merges)."""
        self.num_refactors = {"split": 0, "merge": 0}
        self.hosted: dict[int, dict[int, float]] = {}
        """Per model: machine -> when it last hosted a stage of it (Eq. 13's H_i)."""
        self.refactor_log: list[tuple[float, str, int, int]] = []
        """(time, direction, stages before, stages after) of every completed refactoring."""
        self._autoscale_kept: tuple[AutoscaleSettings, float, AutoscaleSettings] | None = None
        """The last (system settings, mean stages, pipeline settings) handed out."""
        self.marks: list[ScalingMark] = []
        """§7 HRG's scaling event markers: machines a group was placed on or refactored
        onto, and when."""
        self._profiles: dict[int, LayerProfile] = {}
        """Per model: its layer profile (`flexpipe_sizes.layer_profile` reads only what a
        run never changes: the model, its node group's GPU, the system's hop)."""

    @property
    def enabled(self) -> bool:
        """Whether the run's system is a FlexPipe system."""
        return self.settings is not None

    def _profile(self, model: int) -> LayerProfile:
        """`model`'s layer profile, built once (every granularity decision reads it)."""
        profile = self._profiles.get(model)
        if profile is None:
            profile = self._profiles[model] = layer_profile(self.world, model)
        return profile

    def _num_stages(self, pool: Pool) -> int:
        assert self.settings is not None
        state = self.states.get(pool.index, GranularityState())
        arrivals = self._window(pool)
        profile = self._profile(pool.model)
        eta, state = choose_num_stages(arrivals, profile, state, self.settings)
        self.states[pool.index] = state
        return eta

    def _window(self, pool: Pool) -> tuple[float, ...]:
        """The arrivals of the last `cv_window_s` (§6.1's window, `arrivals_in_window`)."""
        assert self.settings is not None
        now = self.world.loop.now_s
        # The pool keeps a longer window (`predictor_window_s`) in arrival order, each at
        # most now: only its tail from the first inside this one can be in it.
        times = list(pool.arrivals_s)
        tail = times[bisect_right(times, now - self.settings.cv_window_s) :]
        return arrivals_in_window(tail, now, self.settings)

    def _choose(self, pool: Pool, eta: int, kept: tuple[int, ...] = ()) -> StageChoice | None:
        """`policy.flexpipe.system.choose_stages` for `eta` stages of `pool`'s model on its
        group's free GPUs: the first stages stay on `kept` (a refactoring), a new group
        (none kept) goes where Eq. 13's affinity says; coarser when the stages do not fit,
        or, for a new group whose model no cut that coarse holds, finer."""
        assert self.settings is not None
        world = self.world
        slot = world.models[pool.model]
        own = [m for m in world.state.machines if m.group is slot.group]
        slot_size = slot_bytes(world, pool.model)
        free = [SlotState(g, slot_size) for m in own for g in world.state.free_on(m)]
        hrg = HrgView(
            {g: world.state.machine_of_gpu[g].index for g in (*kept, *(f.slot_id for f in free))},
            marks=self._recent_marks(),
            now_s=world.loop.now_s,
        )
        affinity = None
        if not kept:
            hosted = self.hosted.get(pool.model, {})
            affinity = Affinity(
                tuple(HostingRecord(m, t) for m, t in sorted(hosted.items())),
                {f.slot_id: world.state.machine_of_gpu[f.slot_id].index for f in free},
                world.loop.now_s,
            )
        return choose_stages(
            self._profile(pool.model),
            eta,
            kept,
            free,
            cv_of_arrivals(self._window(pool)),
            own[0].group.nic_gbps,
            slot_size,
            self.settings,
            affinity,
            hrg,
        )

    def _recent_marks(self) -> tuple[ScalingMark, ...]:
        """The HRG's markers still inside its window (older ones are dropped)."""
        assert self.settings is not None
        window = self.settings.hrg.mark_window_s
        now = self.world.loop.now_s
        self.marks = [m for m in self.marks if now - m.at_s <= window]
        return tuple(self.marks)

    def _mark(self, gpus: tuple[int, ...]) -> None:
        """A scaling event on the machines of `gpus` now (§7 HRG)."""
        machines = {self.world.state.machine_of_gpu[g].index for g in gpus}
        self.marks += [ScalingMark(m, self.world.loop.now_s) for m in sorted(machines)]

    def _hosting(self, model: int, spans: Spans) -> None:
        """The machines of `spans` host `model` now (Eq. 13's history)."""
        hosted = self.hosted.setdefault(model, {})
        for g, _ in spans:
            hosted[self.world.state.machine_of_gpu[g].index] = self.world.loop.now_s

    def _scale_out_num_stages(self, pool: Pool) -> int:
        """§7 Eq. 11/12 for a new group (`scale_out_num_stages`): the arrivals'
        CV times the queue, no finer than its hops are worth, fine enough that the queue is
        served within the TTFT SLO while the model loads split over the stages from the
        best tier its free GPUs hold (`flexpipe_sizes.group_load_s`). The granularity
        controller's state is updated too (it owns the shape from then on)."""
        assert self.settings is not None
        self._num_stages(pool)
        slot = self.world.models[pool.model]
        return scale_out_num_stages(
            self._window(pool),
            len(pool.queue),
            self._profile(pool.model),
            self.world.settings.slo_of(slot.name).ttft_s,
            group_load_s(self.world, pool),
            self.settings,
            decode_steps(pool),
        )

    def shape(self, pool: Pool) -> tuple[list[tuple[int, ...]], list[int], Spans] | None:
        """A new group's workers (one GPU each), bytes per worker and stages; None if
        the stages do not fit the free GPUs."""
        choice = self._choose(pool, self._scale_out_num_stages(pool))
        if choice is None:
            return None
        spans = tuple(zip(choice.slots, choice.bounds, strict=True))
        self._mark(choice.slots)
        return (
            [(g,) for g in choice.slots],
            stage_bytes(self.world, pool.model, choice.bounds),
            spans,
        )

    def autoscale_settings(self, pool: Pool, base: AutoscaleSettings) -> AutoscaleSettings:
        """The autoscaler's settings for `pool`: per group, η times the instance target
        (`policy.flexpipe.groups.pipeline_autoscale`, η the mean of its groups)."""
        stages = [len(self.spans[i.id]) for i in pool.instances if i.id in self.spans]
        if not self.enabled or not stages:
            return base
        mean = sum(stages) / len(stages)
        kept = self._autoscale_kept
        if kept is None or kept[0] is not base or kept[1] != mean:
            # every decision asks, and the mean seldom moves: `pipeline_autoscale` is pure,
            # so the settings it gave for the same inputs are the ones it would give
            kept = self._autoscale_kept = (base, mean, pipeline_autoscale(base, mean))
        return kept[2]

    def register(self, inst: Instance, spans: Spans) -> None:
        """`inst` serves with `spans`: one micro-batch in flight per stage."""
        self.spans[inst.id] = spans
        self._pipeline(inst, len(spans))
        self._hosting(inst.pool_key[0], spans)

    def adopt_warm(self, pool: Pool) -> None:
        """`pool`'s instances serving at time 0 (`SimSettings.warm_instances`, whole models
        on one GPU each) become groups of the stage count a new group gets now (Eq. 11/12
        with no arrivals yet: one stage as shipped, N for a system held at N), their
        first stage on their GPU and the rest on free ones, as the runtime deploys its
        first FlexPipeline: routed to their pipeline target and re-cut by the granularity
        loop like any group (before, they were plain instances the loop never saw, which
        `pack` treated as full)."""
        if not self.enabled:
            return
        layers = self.world.models[pool.model].profile.num_layers
        for inst in pool.instances:
            if inst.id in self.spans:
                continue
            gpu = inst.placement.workers[0][0]
            spans: Spans = ((gpu, (0, layers)),)
            eta = self._scale_out_num_stages(pool)
            choice = self._choose(pool, eta, (gpu,)) if eta > 1 else None
            if choice is not None:
                spans = tuple(zip(choice.slots, choice.bounds, strict=True))
                self.gpus.take(tuple(g for g in choice.slots if g != gpu))
                machine = self.world.state.machine_of_gpu[gpu].index
                inst.placement = Placement(tuple((g,) for g, _ in spans), machine)
                inst.set_hop((len(spans) - 1) * self.world.system.stage_hop_s)
            self.register(inst, spans)
            self.world.result.endpoints_up[inst.id] = (0.0, len(spans))  # it serves as these

    def _pipeline(self, inst: Instance, num_stages: int) -> None:
        """η stages with η micro-batches in flight (§7 Eq. 12: a pipeline serves the sum
        of its stages' throughputs), as many as its KV cache allows, the runtime head's
        count (`microbatch.flexpipe_micro_batches`): that many times the batch limit,
        each step one micro-batch."""
        assert self.settings is not None
        num_layers = self.world.models[inst.pool_key[0]].profile.num_layers
        micro, _ = flexpipe_micro_batches(
            self.settings, num_stages, num_layers, inst.kv_capacity_tokens
        )
        inst.max_batch = self.world.settings.max_batch * micro
        inst.set_micro_batches(micro, num_stages, self.settings.batch_merged_sequences)
        inst.route_target = pipeline_target(self.world.system.autoscale, num_stages)

    def retune(self, pool: Pool) -> None:
        """One granularity decision (at most every `decision_interval_s`, as in the
        runtime's controller): Eq. 4's stage count, at most what is useful
        (`split_stages`), and the splits and merges `group_refactors` names. While a group
        runs, the next decision is scheduled, so a quiet pool (no arrivals, hence no
        autoscaler checks) still merges its stages."""
        if not self.enabled or not any(i.id in self.spans for i in pool.instances):
            return
        assert self.settings is not None
        now = self.world.loop.now_s
        interval = self.settings.decision_interval_s
        if now - self.last_decision_s.get(pool.index, -interval) < interval - 1e-9:
            self._again(pool)
            return
        self.last_decision_s[pool.index] = now
        self._again(pool)
        eta = self._num_stages(pool)
        profile = self._profile(pool.model)
        load_s = group_load_s(self.world, pool)
        finest = split_stages(eta, load_s, profile, decode_steps(pool), self.settings)
        serving = {
            i.id: i for i in pool.instances if i.id in self.spans and i.loaded and not i.released
        }
        for iid in serving:
            self._hosting(pool.model, self.spans[iid])
        views = [
            GroupView(
                i.id, len(self.spans[i.id]), i.outstanding + i.reserved, i.id in self.refactoring
            )
            for i in serving.values()
        ]
        base = self.world.system.autoscale
        for cut in group_refactors(views, finest, len(pool.queue), base, self.settings):
            inst = serving[cut.group_id]
            self._refactor(pool, inst, self.spans[inst.id], cut.num_stages)

    def _again(self, pool: Pool) -> None:
        if pool.index in self.pending:
            return
        assert self.settings is not None
        self.pending.add(pool.index)

        def again() -> None:
            self.pending.discard(pool.index)
            self.retune(pool)

        at = self.last_decision_s[pool.index] + self.settings.decision_interval_s
        self.world.loop.schedule(at, Priority.CONTROL, 5 * KEY_STRIDE + pool.index, again)

    def _refactor(self, pool: Pool, inst: Instance, spans: Spans, eta: int) -> None:
        world = self.world
        choice = self._choose(pool, eta, tuple(g for g, _ in spans))
        if choice is None:
            return
        target = tuple(zip(choice.slots, choice.bounds, strict=True))
        if target == spans:
            return  # no free GPU for a finer cut now
        old_gpus = {g for g, _ in spans}
        self.gpus.take(tuple(g for g in choice.slots if g not in old_gpus))
        self._mark(tuple(g for g in choice.slots if g not in old_gpus))
        valid = [(str(r.id), r.input_tokens + r.generated) for _, _, r in inst.running]
        plan = refactor(spans, target, valid)
        prof = world.models[pool.model].profile
        kv_per_layer_token = prof.kv_bytes_per_token // prof.num_layers
        moved: dict[tuple[int, int], int] = {}
        for mv in plan.block_moves:
            key = (mv.src_slot, mv.dst_slot)
            moved[key] = moved.get(key, 0) + prof.layer_bytes
        for kv in plan.kv_copies:
            key = (kv.src_slot, kv.dst_slot)
            moved[key] = moved.get(key, 0) + kv_per_layer_token * kv.num_tokens
        self.refactoring.add(inst.id)
        inst.sending += 1
        left = [len(moved)]

        def done() -> None:
            left[0] -= 1
            if left[0] > 0:
                return
            inst.sending -= 1
            self.refactoring.discard(inst.id)
            new_gpus = {g for g, _ in target}
            self.gpus.give_back(tuple(g for g, _ in spans if g not in new_gpus))
            machine = world.state.machine_of_gpu[target[0][0]].index
            inst.placement = Placement(tuple((g,) for g, _ in target), machine)
            inst.set_hop((len(target) - 1) * world.system.stage_hop_s)
            self._pipeline(inst, len(target))
            self.spans[inst.id] = target
            self._hosting(pool.model, target)
            direction = "split" if len(target) > len(spans) else "merge"
            self.num_refactors[direction] += 1
            self.refactor_log.append((world.loop.now_s, direction, len(spans), len(target)))
            world.event(pool.model, pool.role, "refactor")
            if inst.outstanding == 0 and not inst.released:
                self.on_idle(pool)

        if not moved:
            left[0] = 1
            done()
            return
        for (src, dst), nbytes in sorted(moved.items()):
            world.net.start(world.state.gpu_to_gpu(src, dst), nbytes, done)
