"""Pipeline groups (`registry-parallel` loads): ParaServe §4-§6 carried out.

In: a pool's scale-out of `count` groups (`start`). Out: for each, GPUs on the members,
parallel fetches of disjoint parts, a pipeline endpoint serving once every part is in,
and then (§6.1) consolidation into standalone instances. Decisions:
- the group: `surge.policy.startup.plan_group` (Alg. 2's contention-adjusted network
  shares, whose per-machine state `networks` this module keeps and advances with
  `paraserve_placement.finish_worker`; then Alg. 1's size by the model's SLO and stage
  times from the cost model) when `group_sizing` is `alg1`; `pipeline_size` workers
  placed by `surge.policy.placement` when `fixed`; parts by bytes
  (`surge.policy.startup.split_blocks`);
- FlexPipe systems: stage count, layers and GPUs from `sim.flexpipe.FlexPipe.shape`
  (and in-flight refactoring at every autoscaler check: `FlexPipe.retune`);
- consolidation: `surge.policy.paraserve_predictor.decide_consolidation` (`predictor`:
  scale down to one worker or up to several) or every member (`scale-up`); kept members
  fetch the rest of the model (taking more GPUs of their machine if the whole model needs
  them), then become instances, the group retires (its requests move to them and
  recompute their KV cache) and the other members' GPUs are freed.
"""

from collections.abc import Callable

from surge.policy.paraserve_placement import ServerNetwork, finish_worker
from surge.policy.paraserve_predictor import PredictorSettings, decide_consolidation
from surge.policy.paraserve_sizing import GpuServer, SizingSettings, StageTimes
from surge.policy.startup import GroupRequest, plan_group, split_blocks
from surge.sim.costs import cost_model
from surge.sim.events import Priority
from surge.sim.fetch import fetch
from surge.sim.flexpipe import FlexPipe
from surge.sim.host_cache import HostCache
from surge.sim.instance import Instance
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.scaling import MIN_KV_FRACTION, WEIGHT_HEADROOM, Gpus, tp_for
from surge.sim.world import World

DEFAULT_PROMPT_TOKENS = 512
"""Prompt length of Alg. 1's prefill time t_p when no request is queued."""


class Groups:
    """Every pipeline group of the run and Alg. 2's network state."""

    def __init__(
        self,
        world: World,
        requests: Requests,
        cache: HostCache,
        gpus: Gpus,
        make_endpoint: Callable[[Pool, Placement, bool], Instance],
        place: Callable[[Pool, int, int], tuple[tuple[int, ...], ...]],
        ready: Callable[[Pool, Instance, float], None],
        flexpipe: FlexPipe,
    ) -> None:
        self.world = world
        self.flexpipe = flexpipe
        self.requests = requests
        self.cache = cache
        self.gpus = gpus
        self.make_endpoint = make_endpoint
        self.place = place
        self.ready = ready
        self.networks: dict[int, ServerNetwork] = {}
        """Alg. 2's state per machine: workers fetching there and their deadlines."""
        self.started = 0

    # --- choosing the group -----------------------------------------------------------
    def start(self, pool: Pool, count: int) -> int:
        """Start up to `count` groups for `pool`; how many started."""
        for n in range(count):
            if not self._start_one(pool):
                return n
        return count

    def _block_bytes(self, model: int) -> tuple[int, ...]:
        total = self.world.models[model].profile.total_bytes
        b = self.world.system.num_blocks
        return tuple(total // b + (1 if i < total % b else 0) for i in range(b))

    def _usable_bytes(self, machine: int) -> int:
        m = self.world.state.machines[machine]
        per_gpu = m.group.gpu.memory_bytes * self.world.settings.kv_memory_fraction
        free = len(self.world.state.free_on(m))
        return int(free * per_gpu * (1 - MIN_KV_FRACTION) / WEIGHT_HEADROOM)

    def _times(self, pool: Pool) -> StageTimes:
        world, sys = self.world, self.world.system
        slot = world.models[pool.model]
        cost = cost_model(slot.profile, slot.group.gpu, slot.tp)
        head = pool.queue[0] if pool.queue else None
        tokens = head.prefill_tokens if head is not None else DEFAULT_PROMPT_TOKENS
        wait = world.loop.now_s - head.arrival_s if head is not None else 0.0
        return StageTimes(
            runtime_init_s=sys.init_s,
            transmission_s=sys.stage_hop_s,
            prefill_s=cost.prefill_s(tokens),
            decode_s=cost.decode_s(1),
            wait_s=max(wait, 0.0),
        )

    def _alg1(self, pool: Pool, blocks: tuple[int, ...]) -> list[tuple[int, int, tuple[int, ...]]]:
        """(machine, bytes it must hold, part) per member, by `plan_group`; [] if none."""
        world = self.world
        slot = world.models[pool.model]
        state = world.state
        servers = []
        for m in state.machines:
            if m.group is slot.group and state.free_on(m):
                fetch = state.fetch_gbps(m.index)
                self.networks.setdefault(m.index, ServerNetwork(m.index, fetch))
                servers.append(
                    GpuServer(m.index, self._usable_bytes(m.index), fetch, m.group.pcie_gbps)
                )
        if not servers:
            return []
        slo = world.settings.slo_of(slot.name)
        self.started += 1
        plan = plan_group(
            GroupRequest(
                block_bytes=blocks,
                servers=tuple(servers),
                times=self._times(pool),
                ttft_slo_s=slo.ttft_s,
                tpot_slo_s=slo.tpot_s,
                settings=SizingSettings(max_pipeline_size=world.system.pipeline_size),
                networks=tuple(self.networks[s.server_id] for s in servers),
                now_s=world.loop.now_s,
                model_id=f"{slot.name}@{self.started}",
            )
        )
        if plan is None:
            return []
        self.networks.update({n.server_id: n for n in plan.networks})
        full = set(plan.sizing.full_memory_servers)
        total = sum(blocks)
        return [
            (m, total if m in full else -(-total // len(plan.members)), part)
            for m, part in zip(plan.members, plan.parts, strict=True)
        ]

    def _start_one(self, pool: Pool) -> bool:
        world, sys = self.world, self.world.system
        slot = world.models[pool.model]
        blocks = self._block_bytes(pool.model)
        workers: list[tuple[int, ...]] = []
        member_bytes: list[int] = []
        tracked: list[int] = []
        model_id = ""
        chosen = self._alg1(pool, blocks) if sys.group_sizing == "alg1" else []
        shaped = self.flexpipe.shape(pool) if self.flexpipe.enabled else None
        if chosen:
            for m, nbytes, part in chosen:
                tp = tp_for(slot.group, nbytes, world.settings.kv_memory_fraction) or 1
                workers.append(world.state.free_on(world.state.machines[m])[:tp])
                member_bytes.append(sum(blocks[b] for b in part))
            tracked = [m for m, _, _ in chosen]
            model_id = f"{slot.name}@{self.started}"
        elif shaped is not None:
            workers, member_bytes, spans = shaped
        else:
            # `fixed`, or Alg. 1 found no group: its fallback (one full-memory worker)
            # needs a server that holds the whole model; then `pipeline_size` workers
            # start instead (reported to the policy owner; see docs/simulator.md).
            size = sys.pipeline_size
            stage_bytes = -(-slot.profile.total_bytes // size)
            tp = tp_for(slot.group, stage_bytes, world.settings.kv_memory_fraction) or 1
            workers = list(self.place(pool, size, tp))
            if len(workers) < size:
                return False
            member_bytes = [sum(blocks[b] for b in part) for part in split_blocks(blocks, size)]
        if not workers:
            return False
        for w in workers:
            self.gpus.take(w)
        machine_of = world.state.machine_of_gpu
        # a multi-worker group is a pipeline: `pipeline_micro_batches` batches in flight
        inst = self.make_endpoint(
            pool, Placement(tuple(workers), machine_of[workers[0][0]].index), len(workers) > 1
        )
        pool.instances.append(inst)
        if shaped is not None and not chosen:
            self.flexpipe.register(inst, spans)
        left = [len(workers)]

        def member_done(i: int) -> None:
            if tracked:
                m = tracked[i]
                self.networks[m] = finish_worker(
                    self.networks[m], f"{model_id}/{m}", world.loop.now_s
                )
            left[0] -= 1
            if left[0] == 0 and not inst.released:
                world.loop.schedule(
                    world.loop.now_s + sys.init_s,
                    Priority.INSTANCE,
                    inst.id,
                    lambda: self._serving(pool, inst, member_bytes),
                )

        for i, (w, nbytes) in enumerate(zip(workers, member_bytes, strict=True)):
            self._fetch(pool, w, nbytes, lambda i=i: member_done(i), count=True)
        return True

    def _fetch(
        self,
        pool: Pool,
        gpus: tuple[int, ...],
        nbytes: int,
        done: Callable[[], None],
        count: bool,
    ) -> None:
        """`nbytes` into `gpus` from host memory (a host copy there) or the model store."""
        world = self.world
        machine = world.state.machine_of_gpu[gpus[0]].index
        hit = world.system.load == "allcache" or self.cache.has_copy(machine, pool.model)
        fetch(world, self.cache, pool.model, gpus, nbytes, hit, done, count)

    # --- serving and consolidating ------------------------------------------------------
    def _serving(
        self,
        pool: Pool,
        group: Instance,
        member_bytes: list[int],
    ) -> None:
        if group.released:
            return
        self.ready(pool, group, 0.0)
        workers = group.placement.workers
        if len(workers) > 1 and self.world.system.consolidation != "none":
            self._consolidate(pool, group, member_bytes)

    def _keep(self, pool: Pool, size: int) -> int:
        sys = self.world.system
        if sys.consolidation == "scale-up":
            return size
        decision = decide_consolidation(
            pool.arrivals_s,
            self.world.loop.now_s,
            len(pool.queue),
            size,
            PredictorSettings(
                window_s=sys.predictor_window_s,
                requests_per_worker=max(1, round(sys.autoscale.target_ongoing_requests)),
                max_pipeline_size=sys.pipeline_size,
            ),
        )
        return 1 if decision.mode == "scale_down" else min(decision.num_workers_to_keep, size)

    def _consolidate(
        self,
        pool: Pool,
        group: Instance,
        member_bytes: list[int],
    ) -> None:
        """ParaServe §6.1: kept members fetch the rest and become instances."""
        world = self.world
        slot = world.models[pool.model]
        full_tp = tp_for(slot.group, slot.profile.total_bytes, world.settings.kv_memory_fraction)
        if full_tp is None:
            return  # no machine of the group holds the whole model: it serves as a group
        wanted = self._keep(pool, len(member_bytes))
        kept: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        for i, w in enumerate(group.placement.workers):
            if len(kept) == wanted:
                break
            machine = world.state.machines[world.state.machine_of_gpu[w[0]].index]
            extra = world.state.free_on(machine)[: max(full_tp - len(w), 0)]
            if len(w) + len(extra) < full_tp:
                continue  # this member's machine cannot hold the whole model
            self.gpus.take(extra)
            kept.append((i, w, extra))
        if not kept:
            return
        # The group stays releasable meanwhile: if the autoscaler gives it back first,
        # the consolidation is abandoned (`_switch` returns the extra GPUs).
        left = [len(kept)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._switch(pool, group, kept)

        total = slot.profile.total_bytes
        for i, w, extra in kept:
            self._fetch(pool, w + extra, total - member_bytes[i], one_done, count=False)

    def _switch(
        self,
        pool: Pool,
        group: Instance,
        kept: list[tuple[int, tuple[int, ...], tuple[int, ...]]],
    ) -> None:
        world = self.world
        if group.released:
            for _, _, extra in kept:
                self.gpus.give_back(extra)
            return
        keep_ids = {i for i, _, _ in kept}
        machine_of = world.state.machine_of_gpu
        for i, w in enumerate(group.placement.workers):
            if i not in keep_ids:
                self.gpus.give_back(w)
        pool.instances.remove(group)
        group.released = True
        for _, w, extra in kept:
            inst = self.make_endpoint(pool, Placement((w + extra,), machine_of[w[0]].index), False)
            pool.instances.append(inst)
            self.ready(pool, inst, 0.0)
        world.event(pool.model, pool.role, "consolidate", len(kept))
        self.requests.requeue(pool, group.drain())
