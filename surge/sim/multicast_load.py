"""Multicast start-ups: a start-up plan's multicast, and serving while it loads.

In: a pool, the `StartupPlan` `plan_startup` made (sources: GPU copies and host copies,
receivers) and its instances (`Loader` hands them over). Out: flows on the cluster's
links (`MulticastRun`; a TP receiver's shards fanned out from its lead GPU) and the
loading actions as blocks arrive, through a `Carrier`: live targets here, the rest
(execution pipelines opened and retired, instances going local, then `ready`) by
`sim/loading_actions.py`. Every decision is a policy call:
- the multicast plan and its execution pipelines: `surge.policy.multicast.scale_out.plan_scale_out`;
- what opens, goes live, goes local and retires as blocks arrive:
  `surge.policy.loading.LoadingState` (λScale §4.3-§4.4, BlitzScale §4);
- where a retired pipeline's requests go: `surge.policy.loading.spread_evenly` over its
  members (λScale §4.4), carried out by `sim/mode_switch.py`;
- whether a multi-GPU receiver's lead GPU passes each block's shards on as it lands
  (λScale §4.3 Case 2): `surge.policy.multicast.nvlink_replication.shards_per_block`.
Plan nodes are start-up ids: an instance's id, or `HOST_NODE + m` for the host copy of
machine m; a host source's blocks leave its machine's NIC from host memory.
"""

import functools
import math
from collections.abc import Callable

from surge.events import BlockLanded
from surge.policy.blitzscale.live_scaling import layer_load_s
from surge.policy.loading import GoLive, LoadingSettings, LoadingState
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.nvlink_replication import shards_per_block
from surge.policy.multicast.plan import Transfer
from surge.policy.multicast.scale_out import MulticastOutcome, MulticastRequest, plan_scale_out
from surge.policy.startup import StartupPlan
from surge.sim.carrier import Carrier
from surge.sim.flows import Link
from surge.sim.host import HostModel
from surge.sim.instance import Instance
from surge.sim.live_scaling import LiveScaling
from surge.sim.loading_actions import LoadingActions
from surge.sim.multicast_run import MulticastRun
from surge.sim.pools import Pool
from surge.sim.world import HOST_NODE, World


class ChainTail:
    """A receiver still loading: its blocks so far and who forwards them on."""

    __slots__ = ("blocks", "num_blocks", "subscribers")

    def __init__(self, num_blocks: int) -> None:
        self.blocks: set[int] = set()
        self.num_blocks = num_blocks
        self.subscribers: list[Callable[[int], None]] = []


@functools.lru_cache(maxsize=512)
def _plan(request: MulticastRequest) -> MulticastOutcome:
    return plan_scale_out(request)


class MulticastLoads:
    """Every pool's multicasts and their serve-while-loading actions (`Loader` starts them)."""

    def __init__(
        self,
        world: World,
        pools: dict[tuple[int, str], Pool],
        live: LiveScaling,
        actions: LoadingActions,
        host: HostModel,
        num_blocks: Callable[[int, int, int], int],
        load_local: Callable[[Pool, Instance, str], None],
    ) -> None:
        self.world = world
        self.pools = pools
        self.live = live
        self.actions = actions
        """Carries out the loading actions other than `GoLive` (`sim/loading_actions.py`)."""
        self.host = host
        """Told of every block transfer and asked what each loading action costs."""
        self.num_blocks = num_blocks
        """B for (model, N, K): the system's, or the elbow (`SimSettings.block_count`)."""
        self.load_local = load_local
        """`Loader.load_local`: the fallback when every source is gone."""
        self.host_sending: dict[int, int] = {}
        """Per machine: multicasts its host copy is sending now (`Instance.sending` for a
        GPU copy); `policy.startup` ranks sources by the egress they have left."""
        self.inflight: dict[int, ChainTail] = {}
        """Per receiving instance id: the blocks landed so far, for later multicasts that
        chain from it (`policy.startup` tier `loading`)."""

    def start(self, pool: Pool, plan: StartupPlan, by_id: dict[int, Instance]) -> None:
        """Multicast to `plan.receivers` from `plan.sources`; serve while loading."""
        world, sys = self.world, self.world.system
        state = world.state
        slot = world.models[pool.model]
        gpu_nodes: dict[int, Instance] = {}
        host_nodes: dict[int, int] = {}
        tails: dict[int, ChainTail] = {}
        for src in plan.sources:
            if src.tier == "host":
                node = by_id.get(src.node)
                host_nodes[src.node] = node.machine if node else src.node - HOST_NODE
            else:
                gpu_nodes[src.node] = self._instance(src.node)
                if src.tier == "loading" and src.node in self.inflight:
                    tails[src.node] = self.inflight[src.node]
        first_tail = next(iter(tails.values()), None)
        tails_cut = first_tail.num_blocks if first_tail is not None else 0
        nodes = plan.multicast_nodes

        def usable(v: int) -> bool:
            if v in host_nodes:
                return True
            inst = gpu_nodes[v]
            if v in tails:  # a chain tail: the same block cut as the first one
                return not inst.released and tails[v].num_blocks == tails_cut
            return not inst.released and inst.loaded

        live_sources = [v for v in nodes[: len(plan.sources)] if usable(v)]
        receivers = [by_id[v] for v in plan.receivers if not by_id[v].released]
        if not live_sources or not receivers:
            for inst in receivers:
                self.load_local(pool, inst, "store")
            return
        gpu_nodes.update({i.id: i for i in receivers})
        nodes = tuple(live_sources) + tuple(i.id for i in receivers)
        k = len(live_sources)

        def gbps(v: int) -> float:
            if v in host_nodes:
                return state.host_network_gbps(host_nodes[v])
            return state.network_gbps(gpu_nodes[v].gpus[0])

        rates = tuple(gbps(v) for v in nodes)
        by_machine: dict[int, list[int]] = {}
        for i, v in enumerate(nodes):
            if v in gpu_nodes:
                by_machine.setdefault(gpu_nodes[v].machine, []).append(i)
        groups = tuple(tuple(g) for g in by_machine.values() if len(g) > 1)
        intra = min(m.group.intra_gpu_gbps for m in state.machines)
        busy = frozenset(
            i
            for i, v in enumerate(nodes[:k])
            if v in gpu_nodes and gpu_nodes[v].role == "prefill" and gpu_nodes[v].outstanding
        )
        if len(busy) == k:
            busy = frozenset()
        # A chain from an in-flight receiver forwards its blocks: the same cut.
        if any(v in tails for v in nodes[:k]):
            blocks = tails_cut
        else:
            blocks = self.num_blocks(pool.model, len(nodes), k)
        request = MulticastRequest(
            num_nodes=len(nodes),
            num_blocks=blocks,
            num_sources=k,
            strategy=sys.multicast_strategy,
            cluster=Cluster(rates, rates, groups, intra, busy),
        )
        outcome = _plan(request)
        # Receivers that forward within the plan hold their egress too (Alg. 1: a chain).
        forwarders = {tr.src for step in outcome.plan.steps for tr in step if tr.src >= k}
        senders = [gpu_nodes[v] for v in nodes[:k] if v in gpu_nodes]
        senders += [gpu_nodes[nodes[v]] for v in sorted(forwarders)]
        for s in senders:
            s.sending += 1
        host_senders = [host_nodes[v] for v in nodes[:k] if v in host_nodes]
        for m in host_senders:
            self.host_sending[m] = self.host_sending.get(m, 0) + 1

        # One lane per GPU index when every GPU pulls its own shard (`shard_multicast`):
        # lane j carries shard j of each block from the sender's GPU j (a host copy: from
        # its machine NIC) to the receiver's GPU j; a block has arrived when every lane
        # has delivered it. Otherwise one lane, lead GPU to lead GPU, whole blocks.
        tp = len(receivers[0].gpus)
        same_tp = all(len(i.gpus) == tp for i in gpu_nodes.values())
        lanes = tp if sys.shard_multicast and tp > 1 and same_tp else 1
        # λScale §4.3 Case 2: with one lane a multi-GPU receiver's lead GPU takes whole
        # blocks and hands each one's shards to its other GPUs as it lands: the member then
        # holds complete blocks for its (tensor-parallel) pipeline stage, and the whole
        # model on every GPU when it goes local.
        per_block = lanes == 1 and any(
            shards_per_block(sys.shard_multicast, len(i.gpus)) for i in receivers
        )

        def path(src: int, dst: int, lane: int = 0) -> tuple[Link, ...]:
            to = gpu_nodes[nodes[dst]].gpus[lane]
            if nodes[src] in host_nodes:
                return state.host_to_remote_gpu(host_nodes[nodes[src]], to)
            return state.gpu_to_gpu(gpu_nodes[nodes[src]].gpus[lane], to)

        loading = LoadingState(
            LoadingSettings(
                num_nodes=len(nodes),
                num_blocks=blocks,
                num_sources=k,
                pipelines=outcome.pipelines,
                mode=sys.serve_while_loading,
                live_start_fraction=sys.live_start_fraction,
            )
        )
        opened: dict[int, Instance] = {}
        # Plan node -> instance (None for a host source; actions name receivers only).
        plan_nodes = [gpu_nodes.get(v) for v in nodes]
        started_s = world.loop.now_s
        num_layers = slot.profile.num_layers
        # (time, layers in the block) of each block landed on each plan node, from the
        # multicast's start (as `runtime/scaleout/live.py` records them)
        landed: dict[int, list[tuple[float, int]]] = {
            v: [(started_s, 0)] for v in range(len(nodes))
        }

        def held_layers(node: int) -> int:
            """Layers 0..n-1 plan node `node` can run: its longest block prefix (as
            `runtime/scaleout/context.held_layers`)."""
            k, held = 0, loading.held[node]
            while k in held:
                k += 1
            return k * num_layers // blocks

        def carry(action: object) -> None:
            if isinstance(action, GoLive):
                inst = plan_nodes[action.node]
                assert inst is not None, "loading actions name receivers"
                held = functools.partial(held_layers, action.node)
                load_s = functools.partial(layer_load_s, landed[action.node])
                self.live.go_live(pool, inst, held, load_s)
            else:
                self.actions.carry_out(pool, action, plan_nodes, opened)

        carrier = Carrier(world.loop, receivers[0].id, self.host.action_s, carry)

        lanes_in: dict[tuple[int, int], int] = {}
        lanes_left = [lanes]

        def on_lane_arrival(node: int, block: int) -> None:
            got = lanes_in.get((node, block), 0) + 1
            lanes_in[(node, block)] = got
            if got == lanes:
                del lanes_in[(node, block)]
                inst = plan_nodes[node]
                if per_block and inst is not None and len(inst.gpus) > 1:
                    self._shard_block(inst, block_bytes, functools.partial(on_arrival, node, block))
                else:
                    on_arrival(node, block)

        def on_lane_finished() -> None:
            lanes_left[0] -= 1
            if lanes_left[0] == 0:
                on_finished()

        for inst in receivers:
            self.inflight[inst.id] = ChainTail(blocks)

        def on_arrival(node: int, block: int) -> None:
            layers = (block + 1) * num_layers // blocks - block * num_layers // blocks
            landed[node].append((world.loop.now_s, layers))
            inst = plan_nodes[node]
            tail = self.inflight.get(inst.id) if inst is not None else None
            if tail is not None:
                tail.blocks.add(block)
                for forward in tail.subscribers:
                    forward(block)
                if len(tail.blocks) == tail.num_blocks:
                    del self.inflight[inst.id]  # type: ignore[union-attr]
            if world.timeline is not None and plan_nodes[node] is not None:
                where = plan_nodes[node].machine  # type: ignore[union-attr]
                world.publish(BlockLanded, model=slot.name, node=where, block=block, tier="gpu")
            for action in loading.arrive(node, block):
                carrier.submit(action)
            if inst is not None:  # a pending live batch may run now (BlitzScale §5.2 (2))
                self.live.landed(inst.id)

        def on_finished() -> None:
            for s in senders:
                s.sending -= 1
            for m in host_senders:
                self.host_sending[m] -= 1

        def on_transfers(delta: int, tr: Transfer, lane: int = 0) -> None:
            sender = plan_nodes[tr.src]
            if sender is None:  # a host copy: no serving process sends it
                self.host.on_transfers(delta, None, None)
            else:
                self.host.on_transfers(delta, sender.gpus[lane], path(tr.src, tr.dst, lane)[0])

        block_bytes = math.ceil(slot.profile.total_bytes / blocks)
        partial = {i: tails[v].blocks for i, v in enumerate(nodes[:k]) if v in tails}
        chained = {"partial_sources": partial} if partial else {}
        runs = [
            MulticastRun(
                world.net,
                outcome.plan,
                functools.partial(path, lane=lane),
                math.ceil(block_bytes / lanes),
                on_lane_arrival,
                on_lane_finished,
                functools.partial(on_transfers, lane=lane),
                **chained,
            )
            for lane in range(lanes)
        ]
        for i in partial:
            tails[nodes[i]].subscribers.append(functools.partial(_forward, runs=runs, node=i))
        for r in runs:
            r.start()

    def _instance(self, iid: int) -> Instance:
        for p in self.pools.values():
            for i in p.instances:
                if i.id == iid:
                    return i
        raise KeyError(iid)

    def _shard_block(self, inst: Instance, block_bytes: int, done: Callable[[], None]) -> None:
        """λScale §4.3 Case 2: a block landed on `inst`'s lead GPU; its other GPUs' shards
        go over the machine's link at once; `done` once every GPU holds its shard."""
        world = self.world
        rest = inst.gpus[1:]
        left = [len(rest)]

        def one_done() -> None:
            left[0] -= 1
            if left[0] == 0:
                done()

        for g in rest:
            path = world.state.gpu_to_gpu(inst.gpus[0], g)
            world.net.start(path, math.ceil(block_bytes / len(inst.gpus)), one_done)


def _forward(block: int, runs: list[MulticastRun], node: int) -> None:
    """A chain tail's new block goes on in every lane's run of the later multicast."""
    for r in runs:
        r.source_got(node, block)
