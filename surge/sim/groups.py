"""Pipeline groups (`registry-parallel` loads): ParaServe §4-§6 carried out.

In: a pool's scale-out of `count` groups (`start`). Out: for each, GPUs on the members,
parallel fetches of disjoint parts, a pipeline endpoint serving once every part is in,
and then (§6.1) consolidation into standalone instances. Decisions:
- the group: `surge.policy.paraserve.group_plan.plan_group` (Alg. 2's contention-adjusted network
  shares, whose per-machine state `networks` this module keeps and advances with
  `placement.finish_worker`; then Alg. 1's size by the model's SLO and stage
  times from the cost model) when `group_sizing` is `alg1`; when `fixed`, or Alg. 1
  finds no group, `surge.policy.paraserve.groups.fixed_group` on the workers
  `surge.policy.placement` places (`pipeline_size`, fewer when fewer GPUs are free, as
  `surge serve` does); parts by bytes (`surge.policy.paraserve.group_plan.split_blocks`); the
  groups of one scale-out in turn, until one cannot start;
- FlexPipe systems: stage count, layers and GPUs from `sim.flexpipe.FlexPipe.shape`
  (and in-flight refactoring at every autoscaler check: `FlexPipe.retune`);
- GPU shares (ParaServe §4.1.1-§4.1.2, `SimSettings.fractional_gpus`): a low-memory
  worker holds 1/s of one GPU (`gpu_share.low_memory_share`), on the GPU
  `gpu_share.pick_gpu` picks (best fit: GPUs are shared by workers of several
  groups and models); Alg. 1 sees a machine with no free GPU as free memory of the
  largest free share;
- the node prefetcher (§5 Fig. 6(b)): members `policy.paraserve.prefetch` names fetch
  the rest into host memory once their part landed (`sim.prefetch`);
- consolidation (§6.1): `sim.consolidation.Consolidation`.
"""

from collections.abc import Callable

from surge.policy.paraserve.gpu_share import SHARE_EPS, low_memory_share, pick_gpu
from surge.policy.paraserve.group_plan import GroupRequest, alg1_inputs, plan_group, split_blocks
from surge.policy.paraserve.groups import fixed_group
from surge.policy.paraserve.placement import ServerNetwork, finish_worker
from surge.policy.paraserve.prefetch import plan_prefetch
from surge.policy.paraserve.sizing import GpuServer, SizingSettings, StageTimes
from surge.policy.placement import MIN_KV_FRACTION, WEIGHT_HEADROOM
from surge.policy.startup import serving_at_s
from surge.sim.consolidation import Consolidation
from surge.sim.costs import cost_model
from surge.sim.events import Priority
from surge.sim.fetch import fetch
from surge.sim.flexpipe import FlexPipe
from surge.sim.gpus import Gpus
from surge.sim.host_cache import HostCache
from surge.sim.instance import Instance
from surge.sim.instance_factory import tp_for
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.prefetch import Prefetches
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
        on_network_change: Callable[[], None] = lambda: None,
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
        self.on_network_change = on_network_change
        """Called when a tracked fetch ends: Alg. 2 may now offer a share it refused, so
        pools waiting for a group decide again (as they do when GPUs are released)."""
        self.prefetches = Prefetches(world, self.networks, on_network_change)
        self.consolidation = Consolidation(
            world,
            requests,
            gpus,
            self.networks,
            self._fetch,
            make_endpoint,
            ready,
            on_network_change,
            self.prefetches,
        )
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

    def _fractional(self, pool: Pool) -> bool:
        """Whether this pool's low-memory workers hold shares of one GPU: fractional GPUs
        on and a full worker fits one GPU (`policy.paraserve.gpu_share`)."""
        slot = self.world.models[pool.model]
        kv = self.world.settings.kv_memory_fraction
        return (
            self.world.settings.fractional_gpus
            and tp_for(slot.group, slot.profile.total_bytes, kv) == 1
        )

    def _usable_bytes(self, machine: int, model_bytes: int, fractional: bool) -> int:
        """GPU memory Alg. 1 may give a worker on `machine`: its free GPUs' usable memory;
        with fractional GPUs and none free, the largest free share of one GPU in units of
        the model (a full worker's memory, which one GPU holds): a share f holds a worker
        of f x M (a low-memory worker of s holds 1/s, §4.1.2)."""
        state = self.world.state
        m = state.machines[machine]
        per_gpu = m.group.gpu.memory_bytes * self.world.settings.kv_memory_fraction
        free = len(state.free_on(m))
        if fractional and free == 0:
            share = max((f for _, f in state.free_shares_on(m)), default=0.0)
            return int((share + SHARE_EPS) * model_bytes)
        return int(free * per_gpu * (1 - MIN_KV_FRACTION) / WEIGHT_HEADROOM)

    def _alg1_inputs(self, pool: Pool) -> tuple[StageTimes, SizingSettings]:
        world = self.world
        slot = world.models[pool.model]
        cost = cost_model(slot.profile, slot.group.gpu, slot.tp)
        head = pool.queue[0] if pool.queue else None
        tokens = head.prefill_tokens if head is not None else DEFAULT_PROMPT_TOKENS
        wait = world.loop.now_s - head.arrival_s if head is not None else 0.0
        return alg1_inputs(world.system, cost.prefill_s(tokens), cost.decode_s(1), wait)

    def _alg1(
        self, pool: Pool, blocks: tuple[int, ...]
    ) -> list[tuple[int, int, tuple[int, ...], bool]]:
        """(machine, bytes it must hold, part, full-memory) per member, by `plan_group`;
        [] if none."""
        world = self.world
        slot = world.models[pool.model]
        state = world.state
        fractional = self._fractional(pool)
        servers = []
        for m in state.machines:
            if m.group is slot.group and (
                state.free_on(m) or (fractional and state.free_shares_on(m))
            ):
                fetch = state.fetch_gbps(m.index)
                self.networks.setdefault(m.index, ServerNetwork(m.index, fetch))
                usable = self._usable_bytes(m.index, sum(blocks), fractional)
                servers.append(GpuServer(m.index, usable, fetch, m.group.pcie_gbps))
        if not servers:
            return []
        slo = world.settings.slo_of(slot.name)
        self.started += 1
        times, settings = self._alg1_inputs(pool)
        plan = plan_group(
            GroupRequest(
                block_bytes=blocks,
                servers=tuple(servers),
                times=times,
                ttft_slo_s=slo.ttft_s,
                tpot_slo_s=slo.tpot_s,
                settings=settings,
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
            (m, total if m in full else -(-total // len(plan.members)), part, m in full)
            for m, part in zip(plan.members, plan.parts, strict=True)
        ]

    def _start_one(self, pool: Pool) -> bool:
        world, sys = self.world, self.world.system
        slot = world.models[pool.model]
        blocks = self._block_bytes(pool.model)
        workers: list[tuple[int, ...]] = []
        shares: list[float] = []
        member_bytes: list[int] = []
        tracked: list[int] = []
        model_id = ""
        chosen = self._alg1(pool, blocks) if sys.group_sizing == "alg1" else []
        shaped = self.flexpipe.shape(pool) if self.flexpipe.enabled else None
        if chosen:
            share = low_memory_share(len(chosen), 1) if self._fractional(pool) else None
            for m, nbytes, part, full in chosen:
                machine = world.state.machines[m]
                if share is not None and not full:
                    # a low-memory worker holds 1/s of one GPU (§4.1.2), the best-fit one
                    gpu = pick_gpu(world.state.free_shares_on(machine), share)
                    if gpu is None:
                        # Alg. 1 saw room for 1/s, but the plan has fewer parts than s
                        # (fewer blocks): a whole GPU if one is free, else no group
                        whole = world.state.free_on(machine)[:1]
                        if not whole:
                            self._forget(f"{slot.name}@{self.started}")
                            return False
                        workers.append(whole)
                        shares.append(1.0)
                    else:
                        workers.append((gpu,))
                        shares.append(share)
                else:
                    tp = tp_for(slot.group, nbytes, world.settings.kv_memory_fraction) or 1
                    workers.append(world.state.free_on(machine)[:tp])
                    shares.append(1.0)
                member_bytes.append(sum(blocks[b] for b in part))
            tracked = [m for m, _, _, _ in chosen]
            model_id = f"{slot.name}@{self.started}"
        elif shaped is not None:
            workers, member_bytes, spans = shaped
        else:
            # `fixed`, or Alg. 1 found no group: `policy.paraserve.groups.fixed_group`, the
            # first `pipeline_size` workers placed, fewer when fewer GPUs are free (each
            # then holds a larger part: as many GPUs as that part needs)
            group = self._fixed(pool, blocks)
            if group is None:
                return False
            workers, member_bytes = group
        if not workers:
            return False
        machine_of = world.state.machine_of_gpu
        placement = Placement(
            tuple(workers),
            machine_of[workers[0][0]].index,
            tuple(shares) if any(s < 1.0 for s in shares) else (),
        )
        self.gpus.take_placement(placement)
        # a multi-worker group is a pipeline: micro-batches in flight (a FlexPipe group's
        # count is `flexpipe_micro_batches`, set by `register`)
        inst = self.make_endpoint(pool, placement, len(workers) > 1)
        pool.instances.append(inst)
        if shaped is not None and not chosen:
            self.flexpipe.register(inst, spans)
        left = [len(workers)]
        launch_s = world.loop.now_s
        rests = self.prefetch_rests(pool, workers, member_bytes) if shaped is None else {}

        def member_done(i: int) -> None:
            if i in rests and not inst.released:  # ParaServe §5: then the rest, into host
                machine = world.state.machine_of_gpu[workers[i][0]].index
                self.prefetches.start(inst.id, i, machine, pool.model, rests[i])
            if tracked:
                m = tracked[i]
                self.networks[m] = finish_worker(
                    self.networks[m], f"{model_id}/{m}", world.loop.now_s
                )
            left[0] -= 1
            if left[0] == 0 and not inst.released:
                world.loop.schedule(
                    serving_at_s(sys, launch_s, world.loop.now_s),
                    Priority.INSTANCE,
                    inst.id,
                    lambda: self._serving(pool, inst, member_bytes),
                )
            if tracked:
                self.on_network_change()

        for i, (w, nbytes) in enumerate(zip(workers, member_bytes, strict=True)):
            self._fetch(pool, w, nbytes, lambda i=i: member_done(i), count=True)
        return True

    def prefetch_rests(
        self, pool: Pool, workers: list[tuple[int, ...]], member_bytes: list[int]
    ) -> dict[int, int]:
        """Member index -> bytes of the rest its node prefetches after its part
        (`policy.paraserve.prefetch.plan_prefetch`, as the runtime: the §6.1 window's
        prediction as the group starts; a member whose machine holds a host copy is warm)."""
        world = self.world
        if len(workers) < 2:
            return {}
        machines = [world.state.machine_of_gpu[w[0]].index for w in workers]
        warm = world.system.load == "allcache"
        tiers = tuple(
            "host" if warm or self.cache.has_copy(m, pool.model) else "remote" for m in machines
        )
        blocks = self._block_bytes(pool.model)
        plans = plan_prefetch(
            tuple(range(len(workers))),
            split_blocks(blocks, len(workers)),
            len(blocks),
            tiers,
            world.system.consolidation,
            self.consolidation.keep(pool, len(workers)),
        )
        total = sum(member_bytes)
        return {p.node: total - member_bytes[p.node] for p in plans if p.rest}

    def _fixed(
        self, pool: Pool, blocks: tuple[int, ...]
    ) -> tuple[list[tuple[int, ...]], list[int]] | None:
        """`fixed_group` on the workers `policy.placement` places: the largest group of up
        to `pipeline_size` whose workers find GPUs. Workers and their bytes; None if none."""
        world = self.world
        slot = world.models[pool.model]
        for size in range(min(world.system.pipeline_size, len(blocks)), 0, -1):
            stage_bytes = -(-slot.profile.total_bytes // size)
            tp = tp_for(slot.group, stage_bytes, world.settings.kv_memory_fraction) or 1
            placed = list(self.place(pool, size, tp))
            group = fixed_group(range(len(placed)), blocks, size)
            if group is not None and len(group.members) == size:
                workers = [placed[i] for i in group.members]
                return workers, [sum(blocks[b] for b in part) for part in group.parts]
        return None

    def _forget(self, model_id: str) -> None:
        """A planned group that does not start: its workers leave Alg. 2's state (every
        worker Alg. 2 admitted for it, members or not)."""
        now = self.world.loop.now_s
        for m, network in list(self.networks.items()):
            for w in network.workers:
                if w.worker_id.startswith(f"{model_id}/"):
                    self.networks[m] = finish_worker(self.networks[m], w.worker_id, now)

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
            self.consolidation.start(pool, group, member_bytes)
