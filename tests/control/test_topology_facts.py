"""The controller's part of the multicast's topology: the settings that give agents their
caps and host groups, and the egress facts it reports for P/D (`control/pd.egress_traffic`)."""

from types import SimpleNamespace

import pytest

from surge.control.launching import launch_cluster
from surge.control.pd import egress_traffic
from surge.control.settings import ControllerConfig
from surge.errors import SurgeError
from surge.policy.blitzscale.pd import DECODE, PREFILL
from surge.policy.multicast.topology import NodeTraffic
from surge.runtime.endpoints import LocalEndpoint


def _dep(roles: dict[int, str], parked_on: list[int]) -> SimpleNamespace:
    """A deployment with these roles; `parked_on`: the node of each hand-off parked or in
    flight (`PdServing.egress_handoffs`, counted in tests/runtime/test_pd_parallel.py)."""
    eps = {n: LocalEndpoint(None, n, "m", f"m-node{n}") for n in roles}  # type: ignore[arg-type]
    out = {n: parked_on.count(n) for n in set(parked_on)}
    pd = SimpleNamespace(
        roles={eps[n].name: r for n, r in roles.items()}, egress_handoffs=lambda: out
    )
    server = SimpleNamespace(pd=pd, endpoints={e.name: e for e in eps.values()})
    return SimpleNamespace(server=server)


def test_prefill_instances_and_parked_handoffs_are_reported_per_node() -> None:
    a = _dep({0: PREFILL, 1: DECODE, 2: PREFILL}, parked_on=[2, 2])
    b = _dep({0: PREFILL, 3: DECODE}, parked_on=[])
    colocated = SimpleNamespace(server=SimpleNamespace(pd=None, endpoints={}))
    traffic = egress_traffic([a, b, colocated])  # type: ignore[list-item]
    assert traffic == {0: NodeTraffic(2, 0), 2: NodeTraffic(1, 2)}


def test_serve_settings_reach_the_launched_agents(tmp_path) -> None:
    cfg = ControllerConfig(
        state_dir=tmp_path, nodes=3, egress_gbps=(1.0, 2.0, 3.0), host_groups=((1, 2),)
    )
    cluster = launch_cluster(cfg, tmp_path)
    agent = cluster.agent_config(2)  # type: ignore[attr-defined]
    assert agent.egress_gbps == 3.0 and agent.host_group == "host1" and agent.host_mates == (1,)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"egress_gbps": (1.0,)}, "one cap > 0 per node"),
        ({"ingress_gbps": (1.0, 0.0)}, "one cap > 0 per node"),
        ({"host_groups": ((0, 1), (1,))}, "disjoint node ids"),
        ({"host_groups": ((0, 5),)}, "disjoint node ids"),
        ({"host_groups": ((0, 1),), "launcher": "ray"}, "need --launcher local"),
    ],
)
def test_bad_topology_settings_are_refused(tmp_path, kwargs: dict, words: str) -> None:
    with pytest.raises(SurgeError, match=words):
        ControllerConfig(state_dir=tmp_path, nodes=2, **kwargs)
