"""A start-up's loading actions carried out in the simulator (λScale §4.3-§4.4, §5).

In: one `surge.policy.loading` action of a multicast (`sim/multicast_load.py`) or a warm
group (`sim/warm_load.py`), handed over by a `Carrier` at the runtime's opening costs, with
the plan's nodes (receiver instances; None for a host source) and the group's open
pipelines. Out: an execution pipeline opened (an endpoint over its members' GPUs) or
retired (its requests spread over its members, λScale §4.4, `sim/mode_switch.py`), a
receiver no longer live, an instance that holds the whole model started (`Loader.ready`).
`GoLive` is the multicast's own (it needs the blocks each receiver holds). Owned by the
`Loader` (`sim/loading.py`); the runtime's counterpart is
`runtime/scaleout/multicast.LoadingCarrier.carry_out`.
"""

from collections.abc import Callable

from surge.events import PipelineRetired
from surge.policy.loading import GoLocal, OpenPipeline, RetirePipeline
from surge.sim.instance import Instance
from surge.sim.live_scaling import LiveScaling
from surge.sim.mode_switch import SpreadRequests
from surge.sim.placement import Placement
from surge.sim.pools import Pool, Requests
from surge.sim.world import World


class LoadingActions:
    """Every pool's loading actions but `GoLive`: pipelines opened and retired, going local."""

    def __init__(
        self,
        world: World,
        requests: Requests,
        live: LiveScaling,
        make_endpoint: Callable[[Pool, Placement, bool], Instance],
        ready: Callable[[Pool, Instance, float], None],
    ) -> None:
        self.world = world
        self.requests = requests
        self.live = live
        self.make_endpoint = make_endpoint
        self.ready = ready
        """`Loader.ready`: an instance holding the whole model serves after a delay."""
        self.mode_switch = SpreadRequests(requests)
        """Where retired pipelines' requests go (λScale §4.4)."""

    def carry_out(
        self,
        pool: Pool,
        action: object,
        plan_nodes: list[Instance | None],
        opened: dict[int, Instance],
    ) -> None:
        """One `surge.policy.loading` action of a multicast (`GoLive` is its own:
        `MulticastLoads.start`) or a warm group (`sim/warm_load.py`)."""

        def node(v: int) -> Instance:
            inst = plan_nodes[v]
            assert inst is not None, "loading actions name receivers, never host sources"
            return inst

        if isinstance(action, OpenPipeline):
            members = [node(v) for v in action.pipeline.nodes]
            if any(m.released for m in members):
                return
            placement = Placement(tuple(m.gpus for m in members), members[0].machine)
            ep = self.make_endpoint(pool, placement, True)
            ep.serving = True
            self.world.result.endpoints_up[ep.id] = (self.world.loop.now_s, len(members))
            opened[action.index] = ep
            pool.pipelines.append(ep)
            self.world.event(pool.model, pool.role, "pipeline")
            self.world.publish_pipeline(
                pool.model, action.pipeline, [m.machine for m in members], f"pipe{ep.id}"
            )
            self.requests.drain(pool)
        elif isinstance(action, RetirePipeline):
            ep = opened.pop(action.index, None)
            if ep is not None:
                pool.pipelines.remove(ep)
                ep.released = True
                name = self.world.models[pool.model].name
                self.world.publish(PipelineRetired, model=name, name=f"{name}-pipe{ep.id}")
                self.mode_switch.spread_retired(
                    pool, ep.drain(), [node(v) for v in action.pipeline.nodes]
                )
        elif isinstance(action, GoLocal):
            self.live.go_local(node(action.node))
            self._go_local(pool, node(action.node))

    def _go_local(self, pool: Pool, inst: Instance) -> None:
        """The instance holds the whole model (one GPU, or every block's shards on each of
        its GPUs: `MulticastLoads._shard_block`): it starts, unless it was released meanwhile."""
        if inst.released:
            self.mode_switch.hand_over(pool, inst)  # its share goes back to the queue
            return
        self.ready(pool, inst, self.world.system.init_s)
