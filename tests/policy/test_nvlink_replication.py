"""λScale §4.3 Case 3 in the binomial planner (`policy/multicast/nvlink_replication.py`):
where targets share a machine with a fast link, one of them receives each block over the
network and the machine's others get it over NVLink; the replicas form their own
cross-machine pipelines (Fig. 6c); without a faster local link the plan is Case 1's."""

import pytest

from surge.policy.multicast.binomial import plan_binomial
from surge.policy.multicast.cluster import Cluster
from surge.policy.multicast.plan import Plan, completion_steps
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out

B = 8


def _cluster(n: int, groups: tuple[tuple[int, ...], ...], nvlink_gbps: float = 1600.0) -> Cluster:
    return Cluster((100.0,) * n, (100.0,) * n, groups, nvlink_gbps)


def _machine(n: int, cluster: Cluster) -> list[int]:
    """Each node's machine: its NVLink group's first node, else itself."""
    return [(cluster.nvlink_group_of(v) or (v,))[0] for v in range(n)]


def _network_in(plan: Plan, machine: list[int]) -> dict[int, list[int]]:
    """machine -> the nodes on it that receive over the network, with repeats per block."""
    out: dict[int, list[int]] = {}
    for step in plan.steps:
        for tr in step:
            if machine[tr.src] != machine[tr.dst]:
                out.setdefault(machine[tr.dst], []).append(tr.dst)
    return out


@pytest.mark.parametrize(
    "n,k,groups",
    [
        (13, 1, ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))),  # 1 -> 3 machines of 4
        (13, 2, ((0, 1, 2), (3, 4, 5, 6), (7, 8, 9, 10))),  # a source's machine-mates
        (9, 1, ((1, 2), (5, 6, 7))),  # machines of 2 and 3 GPUs, and lone nodes
    ],
    ids=["1-source", "2-source", "mixed"],
)
def test_each_machine_receives_each_block_once_over_the_network(n, k, groups) -> None:
    cluster = _cluster(n, groups)
    out = plan_scale_out(MulticastRequest(n, B, k, "binomial", cluster))
    machine = _machine(n, cluster)
    network = _network_in(out.plan, machine)
    for m, nodes in network.items():
        assert len(set(nodes)) == 1, (m, nodes)  # one network receiver per machine
        assert len(nodes) == B  # each block crosses into the machine once
    source_machines = {machine[s] for s in range(k)}
    assert not source_machines & set(network)  # a source's mates: NVLink only
    assert all(c > 0 for c in completion_steps(out.plan)[k:])  # everyone gets everything
    # Case 1 on every GPU (main before Case 3) sends blocks into machines many times over
    plain = _network_in(plan_binomial(n, B, k, cluster), machine)
    assert sum(map(len, plain.values())) > sum(map(len, network.values()))


def test_replicas_form_cross_machine_pipelines() -> None:
    # Fig. 6c: "each local model block replica forms a separate cross-node execution
    # pipeline": with two sources, pipelines pair the j-th GPU of different machines.
    groups = ((2, 3), (4, 5), (6, 7), (8, 9))
    cluster = _cluster(10, groups)
    out = plan_scale_out(MulticastRequest(10, B, 2, "binomial", cluster))
    machine = _machine(10, cluster)
    assert out.pipelines
    for p in out.pipelines:
        assert len({machine[v] for v in p.nodes}) == len(p.nodes)  # each from a machine
        replica = {cluster.nvlink_group_of(v).index(v) for v in p.nodes}  # type: ignore[union-attr]
        assert len(replica) == 1  # the same GPU index on each machine
    replica_1 = [p for p in out.pipelines if all(v % 2 == 1 for v in p.nodes)]
    assert replica_1  # the mates (second GPUs) serve as a pipeline of their own


def test_no_faster_local_link_keeps_case_1() -> None:
    groups = ((1, 2, 3, 4),)
    slow = _cluster(5, groups, nvlink_gbps=100.0)  # a local link no faster than the NIC
    out = plan_scale_out(MulticastRequest(5, B, 1, "binomial", slow))
    assert out.plan == plan_binomial(5, B, 1, slow)
