"""BlitzScale Alg. 1: bandwidth-ordered chains, one per source, NVLink groups, pruning."""

import pytest

from surge.errors import SurgeError
from surge.policy.multicast.chain import build_chains, plan_chain
from surge.policy.multicast.cluster import Cluster
from tests.policy.replay import replay


def _chains_from(children: dict[int, tuple[int, ...]], roots: list[int]) -> list[list[int]]:
    chains = []
    for root in roots:
        chain, node = [root], root
        while node in children:
            assert len(children[node]) == 1
            node = children[node][0]
            chain.append(node)
        chains.append(chain)
    return chains


def test_one_source_uniform_links_is_one_chain_of_b_plus_n_minus_2_steps() -> None:
    plan = plan_chain(6, 10, 1, Cluster.uniform(6, 100.0))
    replay(plan)
    assert plan.complete_step == 10 + 6 - 2
    assert _chains_from(build_chains(6, 1, Cluster.uniform(6, 100.0)).children, [0]) == [
        [0, 1, 2, 3, 4, 5]
    ]


def test_targets_are_chained_fastest_first() -> None:
    cluster = Cluster.symmetric([100.0, 10.0, 40.0, 100.0, 25.0, 400.0])
    chain = _chains_from(build_chains(6, 1, cluster).children, [0])[0]
    assert chain == [0, 5, 3, 2, 4, 1]


def test_several_sources_give_several_chains() -> None:
    cluster = Cluster.uniform(11, 100.0)
    chains = _chains_from(build_chains(11, 3, cluster).children, [0, 1, 2])
    assert [c[0] for c in chains] == [0, 1, 2]
    assert sorted(n for c in chains for n in c[1:]) == list(range(3, 11))
    assert max(len(c) for c in chains) - min(len(c) for c in chains) <= 1
    plan = plan_chain(11, 7, 3, cluster)
    replay(plan)
    assert plan.complete_step == 7 + 3 - 1  # chains of three targets each


def test_faster_source_gets_the_faster_targets() -> None:
    cluster = Cluster.symmetric([50.0, 200.0, 200.0, 40.0, 200.0, 30.0])
    chains = _chains_from(build_chains(6, 2, cluster).children, [0, 1])
    assert chains[1][1] == 2  # source 1 (200) feeds the fastest target first


def test_nvlink_group_collapses_to_one_network_target() -> None:
    cluster = Cluster(
        egress_gbps=(100.0,) * 6,
        ingress_gbps=(100.0, 50.0, 100.0, 200.0, 100.0, 100.0),
        nvlink_groups=((2, 3, 4),),
    )
    children = build_chains(6, 1, cluster).children
    # Node 3 (fastest ingress) receives from the network, 2 and 4 over NVLink after it.
    network_parents = {c: p for p, cs in children.items() for c in cs}
    assert network_parents[3] == 0
    assert network_parents[2] == 3 and network_parents[4] == 2
    plan = plan_chain(6, 5, 1, cluster)
    replay(plan)


def test_nvlink_targets_next_to_a_source_are_fed_locally() -> None:
    cluster = Cluster((100.0,) * 5, (100.0,) * 5, nvlink_groups=((0, 3),))
    children = build_chains(5, 1, cluster).children
    assert children[0] == (3,)
    assert children[3] == (1,)  # the network chain continues from the NVLink tail
    replay(plan_chain(5, 4, 1, cluster))


def test_busy_sources_are_pruned() -> None:
    cluster = Cluster((100.0,) * 6, (100.0,) * 6, busy_egress=frozenset({0}))
    chains = build_chains(6, 2, cluster)
    assert chains.pruned_sources == (0,)
    assert 0 not in chains.children
    plan = plan_chain(6, 4, 2, cluster)
    replay(plan)
    assert all(t.src != 0 for step in plan.steps for t in step)


def test_all_sources_busy_is_a_user_error() -> None:
    cluster = Cluster((100.0,) * 4, (100.0,) * 4, busy_egress=frozenset({0, 1}))
    with pytest.raises(SurgeError, match="busy"):
        plan_chain(4, 4, 2, cluster)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"egress_gbps": (1.0, 2.0), "ingress_gbps": (1.0,)}, "ingress"),
        ({"egress_gbps": (1.0, 0.0), "ingress_gbps": (1.0, 1.0)}, "> 0"),
        ({"egress_gbps": (1.0,) * 3, "ingress_gbps": (1.0,) * 3, "nvlink_groups": ((0,),)}, ">= 2"),
        (
            {
                "egress_gbps": (1.0,) * 3,
                "ingress_gbps": (1.0,) * 3,
                "nvlink_groups": ((0, 1), (1, 2)),
            },
            "disjoint",
        ),
    ],
)
def test_malformed_clusters_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(SurgeError, match=message):
        Cluster(**kwargs)
