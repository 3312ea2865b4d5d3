"""The body's facts to BlitzScale's planner (`policy.multicast.topology`): link caps, host
groups and busy egress become the `Cluster` Alg. 1 (§5.1) plans on."""

import pytest

from surge.errors import SurgeError
from surge.policy.multicast.chain import build_chains
from surge.policy.multicast.scale_out import MulticastRequest, plan_scale_out
from surge.policy.multicast.topology import (
    HOST_LINK_GBPS,
    UNCAPPED_GBPS,
    NodeLinks,
    NodeTraffic,
    busy_sources,
    multicast_cluster,
)
from tests.policy.replay import replay

PREFILL = NodeTraffic(prefill_instances=1)
FREE = NodeTraffic()


def _chain(children: dict[int, tuple[int, ...]], root: int) -> list[int]:
    chain = [root]
    while chain[-1] in children:
        chain.append(children[chain[-1]][0])
    return chain


def test_uncapped_nodes_are_planned_at_the_documented_default() -> None:
    cluster = multicast_cluster(1, [NodeLinks()] * 3)
    assert cluster.egress_gbps == cluster.ingress_gbps == (UNCAPPED_GBPS,) * 3
    assert not cluster.nvlink_groups and not cluster.busy_egress


def test_a_slow_node_moves_to_the_end_of_the_chain_when_its_cap_changes() -> None:
    links = [NodeLinks(10.0, 10.0)] * 4
    before = _chain(build_chains(4, 1, multicast_cluster(1, links)).children, 0)
    assert before == [0, 1, 2, 3]
    slow = [links[0], NodeLinks(10.0, 1.0), links[2], links[3]]
    after = _chain(build_chains(4, 1, multicast_cluster(1, slow)).children, 0)
    assert after == [0, 2, 3, 1]


def test_a_host_group_is_fed_by_one_network_transfer() -> None:
    links = [NodeLinks(), NodeLinks(), NodeLinks(host="h"), NodeLinks(host="h", host_gbps=40.0)]
    cluster = multicast_cluster(1, links)
    assert cluster.nvlink_groups == ((2, 3),) and cluster.nvlink_gbps == 40.0
    children = build_chains(4, 1, cluster).children
    parents = {c: p for p, cs in children.items() for c in cs}
    # One of the group receives over the network, the other from it over the host link.
    assert {parents[2], parents[3]} & {2, 3} and len({parents[2], parents[3]} - {2, 3}) == 1
    assert multicast_cluster(1, [NodeLinks(host="h"), NodeLinks(host="h")]).nvlink_gbps == (
        HOST_LINK_GBPS
    )


def test_a_busy_prefill_source_is_pruned_and_never_all_sources() -> None:
    assert busy_sources(2, [PREFILL, FREE, FREE]) == {0}
    assert busy_sources(2, [FREE, NodeTraffic(handoffs_out=2), FREE]) == {1}
    # Every source busy: the least busy one still sends.
    assert busy_sources(2, [NodeTraffic(2, 1), PREFILL, FREE]) == {0}
    cluster = multicast_cluster(2, [NodeLinks()] * 5, [PREFILL, FREE, FREE, FREE, FREE])
    request = MulticastRequest(5, 3, num_sources=2, strategy="chain", cluster=cluster)
    out = plan_scale_out(request)
    replay(out.plan)
    assert {t.src for step in out.plan.steps for t in step} & {0, 1} == {1}


def test_bad_facts_are_refused_with_the_fix() -> None:
    with pytest.raises(SurgeError, match="egress_gbps must be > 0"):
        NodeLinks(egress_gbps=0.0)
    with pytest.raises(SurgeError, match="sources < nodes"):
        multicast_cluster(2, [NodeLinks()] * 2)
    with pytest.raises(SurgeError, match="traffic describes"):
        multicast_cluster(1, [NodeLinks()] * 3, [FREE])


def test_start_up_sends_from_a_free_copy_before_a_busy_one() -> None:
    from surge.policy.startup import Copy, Destination, StartupRequest, plan_startup
    from surge.policy.systems import system_config

    system = system_config("blitzscale")
    busy_first = (Copy(0, "gpu", 0, busy_egress=True), Copy(1, "gpu", outstanding=3))
    plan = plan_startup(StartupRequest(system, (Destination(2),), busy_first))
    assert [s.node for s in plan.sources] == [1]  # the loaded but free decode copy
    free = (Copy(0, "gpu", 0), Copy(1, "gpu", outstanding=3))
    assert [
        s.node for s in plan_startup(StartupRequest(system, (Destination(2),), free)).sources
    ] == [0]
