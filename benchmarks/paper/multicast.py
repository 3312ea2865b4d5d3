"""Isolated scale-outs in the simulator, for the paper figures on multicast.

In: a cluster preset, a model, a system, how many sources and destinations. Out: the
virtual seconds until every destination holds the model (`complete_s`) and until the
first new serving capacity (`first_capacity_s`: an execution pipeline or a complete
destination), measured by running the system's plan as flows (`MulticastRun`) and
feeding the arrivals to `surge.policy.loading.LoadingState`, as the simulator does.
"""

import math

from surge.policy.loading import GoLocal, LoadingSettings, LoadingState, OpenPipeline
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
from surge.policy.systems import SystemConfig
from surge.sim.cluster_state import ClusterState
from surge.sim.events import EventLoop
from surge.sim.flows import FlowNetwork
from surge.sim.hardware import load_cluster
from surge.sim.models import load_model
from surge.sim.multicast_run import MulticastRun


def isolated_multicast(
    cluster: str,
    model: str,
    system: SystemConfig,
    num_nodes: int,
    num_sources: int = 1,
    arrivals: dict[tuple[int, int], float] | None = None,
) -> dict[str, float]:
    """Times of one scale-out of `model` from `num_sources` to all `num_nodes` nodes;
    `arrivals` (when given) gets each (node, block)'s arrival time (λScale Fig. 8)."""
    loop = EventLoop()
    net = FlowNetwork(loop)
    state = ClusterState(load_cluster(cluster), net)
    prof = load_model(model)
    machines = state.machines[:num_nodes]
    leads = [m.first_gpu for m in machines]
    gbps = tuple(state.network_gbps(g) for g in leads)
    request = MulticastRequest(
        num_nodes,
        system.num_blocks,
        num_sources,
        system.multicast_strategy,
        Cluster(gbps, gbps),
        math.ceil(prof.total_bytes / system.num_blocks),
    )
    outcome = plan_scale_out(request)
    times: dict[str, float] = {"first_capacity_s": math.inf, "complete_s": 0.0}
    fanout = machines[0].group.gpus_per_node

    loading = LoadingState(
        LoadingSettings(
            num_nodes,
            system.num_blocks,
            num_sources,
            outcome.pipelines,
            system.serve_while_loading,
            system.live_start_fraction,
        )
    )
    intra_bytes_s = machines[0].group.intra_gpu_gbps * 1e9 / 8

    def on_arrival(node: int, block: int) -> None:
        if arrivals is not None:
            arrivals[(node, block)] = loop.now_s
        for action in loading.arrive(node, block):
            t = loop.now_s
            if isinstance(action, GoLocal) and fanout > 1:
                # multi-GPU node: the lead GPU forwards shards over NVLink/PCIe (λScale §4.3)
                t += prof.total_bytes / fanout / intra_bytes_s
            if isinstance(action, OpenPipeline | GoLocal):
                times["first_capacity_s"] = min(times["first_capacity_s"], t)
            if isinstance(action, GoLocal):
                times["complete_s"] = max(times["complete_s"], t)

    run = MulticastRun(
        net,
        outcome.plan,
        lambda src, dst: state.gpu_to_gpu(leads[src], leads[dst]),
        math.ceil(prof.total_bytes / system.num_blocks),
        on_arrival,
        lambda: None,
    )
    loop.schedule(system.group_setup_s, 0, 0, run.start)
    loop.run()
    return times
