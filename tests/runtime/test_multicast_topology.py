"""The runtime plans its multicast on the topology its agents report (BlitzScale §5.1,
Alg. 1), and the measured multicast follows that plan.

Each agent reports its NIC caps and host group in its hello (`set_peers`); the runtime's
`plan_multicast` turns them, with what each source's egress carries, into the planner's
`Cluster`. Token buckets make a capped node slow for real; the events of the multicast say
who sent which block to whom, which must be the plan's forest.
"""

import asyncio
from collections.abc import Mapping

import pytest

from surge.policy.multicast.topology import NodeLinks, NodeTraffic
from surge.policy.systems import system_config
from surge.runtime.launch.local import LocalCluster
from surge.runtime.multicast import MulticastExecutor, MulticastResult
from surge.runtime.protocol import BlockArrived, LinkReport, SetPeersOp
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext
from surge.runtime.scaleout.multicast import plan_multicast
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL, connected

NIC_GBPS = 0.4
SLOW_GBPS = 0.04


async def _nothing(node: int, ep: object) -> None:
    return None


def _ctx(
    client, manifest, links: Mapping[int, NodeLinks], traffic: Mapping[int, NodeTraffic]
) -> ScaleOutContext:
    return ScaleOutContext(
        client,
        Server(client, MODEL),
        manifest,
        system_config("blitzscale"),
        (),
        ControllerHooks(on_local=_nothing, traffic=lambda: dict(traffic)),  # type: ignore[arg-type]
        links=links,
    )


def _senders(plan, agents: list[int]) -> dict[tuple[int, int], int]:
    """(receiving agent, block) -> sending agent, as planned."""
    return {(agents[t.dst], t.block): agents[t.src] for step in plan.steps for t in step}


def _measured(result: MulticastResult) -> dict[tuple[int, int], int]:
    """(receiving agent, block) -> sending agent, as it happened."""
    return {
        (ev.node, ev.block): ev.src
        for ev in result.events
        if isinstance(ev, BlockArrived) and ev.src is not None
    }


def _run(cluster: LocalCluster, manifest, agents, sources, traffic=None):
    """Hello -> links; plan as the runtime does (and as it did with no topology); run it."""
    blocks = list(range(manifest.num_blocks))

    async def run():
        client = await connected(cluster, manifest, {s: blocks for s in sources})
        try:
            hello = await client.broadcast(SetPeersOp(peers=dict(cluster.addresses)))
            links = {n: LinkReport.planned(r.links) for n, r in hello.items()}
            out = plan_multicast(_ctx(client, manifest, links, traffic or {}), agents, len(sources))
            blind = plan_multicast(_ctx(client, manifest, {}, {}), agents, len(sources))
            result = await MulticastExecutor(
                client, MODEL, out.plan, agents, tier="host", timeout_s=60
            ).run()
            return links, out.plan, blind.plan, result
        finally:
            await client.close()

    return asyncio.run(run())


def _check_follows(plan, agents: list[int], result: MulticastResult) -> None:
    assert result.complete_s is not None and not result.replans
    assert _measured(result) == _senders(plan, agents)
    for v in range(len(agents)):
        want = [t.block for step in plan.steps for t in step if t.dst == v]
        assert result.arrival_order[v] == want


def test_a_slow_node_is_chained_last_and_is_slow(make_cluster, manifest) -> None:
    ingress = (NIC_GBPS, SLOW_GBPS, NIC_GBPS, NIC_GBPS)
    cluster = make_cluster(4, egress_gbps=(NIC_GBPS,) * 4, ingress_gbps=ingress)
    agents = [0, 1, 2, 3]
    links, plan, blind, result = _run(cluster, manifest, agents, [0])
    assert links[1] == NodeLinks(NIC_GBPS, SLOW_GBPS)
    # Without the topology the chain is 0->1->2->3; with it the slow node goes last.
    assert _senders(blind, agents)[(1, 0)] == 0
    assert {r: s for (r, b), s in _senders(plan, agents).items() if b == 0} == {2: 0, 3: 2, 1: 3}
    _check_follows(plan, agents, result)
    done = [max(t for t in result.arrival_s[v] if t is not None) for v in agents]
    assert done[1] == max(done)
    # Its bucket paces it: the whole model at its cap, give or take a burst.
    assert done[1] >= 0.8 * manifest.total_bytes * 8 / (SLOW_GBPS * 1e9)


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_host_group_is_fed_once_over_the_network(make_cluster, manifest) -> None:
    group = (1, 3, 4)
    nic_gbps = NIC_GBPS / 4
    cluster = make_cluster(5, link_gbps=nic_gbps, host_groups=(group,), group_gbps=NIC_GBPS * 10)
    agents = [0, 1, 2, 3, 4]
    links, plan, blind, result = _run(cluster, manifest, agents, [0])
    assert {links[n].host for n in group} == {"host1"} and links[2].host is None

    def fed_from_outside(p) -> set[int]:
        return {r for (r, _), s in _senders(p, agents).items() if r in group and s not in group}

    assert len(fed_from_outside(blind)) > 1  # a chain through the group's members one by one
    assert len(fed_from_outside(plan)) == 1  # one network transfer per block into the group
    _check_follows(plan, agents, result)
    head = fed_from_outside(plan).pop()
    last = manifest.num_blocks - 1
    # The mates get each block over the fast host link soon after the head does.
    one_hop_s = manifest.blocks[last].size_bytes * 8 / (nic_gbps * 1e9)
    for mate in set(group) - {head}:
        lag = result.arrival_s[mate][last] - result.arrival_s[head][last]
        assert lag < one_hop_s  # through the NIC it would take a hop per mate at least


def test_a_busy_prefill_source_is_pruned(make_cluster, manifest) -> None:
    cluster = make_cluster(4, link_gbps=NIC_GBPS)
    agents = [0, 1, 2, 3]
    busy = {0: NodeTraffic(prefill_instances=1)}
    _, plan, blind, result = _run(cluster, manifest, agents, [0, 1], busy)
    assert 0 in set(_senders(blind, agents).values())  # free, it would send
    assert set(_senders(plan, agents).values()) <= {1, 2, 3} - {0}
    _check_follows(plan, agents, result)
    assert 0 not in set(_measured(result).values())
