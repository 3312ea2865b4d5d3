"""`policy.adoption`: what a restarted controller adopts of what the agents run, and what it
closes, each with its reason."""

from surge.policy.adoption import (
    Adopt,
    Close,
    Drop,
    HeldModel,
    NodeReport,
    Release,
    Restored,
    Running,
    adopted_idle_since_s,
    plan,
)

D = "sha256:aaaa"


def restored(max_instances: int = 4, digest: str = D) -> Restored:
    return Restored(digest, 3, {n: f"m-node{n}" for n in range(4)}, max_instances)


def held(gpu: int = 3, digest: str = D) -> HeldModel:
    return HeldModel(digest, frozenset(range(gpu)))


def node(n: int, *running: Running, gpu: int = 3, digest: str = D, model: str = "m") -> NodeReport:
    return NodeReport(n, {model: held(gpu, digest)}, running)


def inst(n: int, *req_ids: str, model: str = "m") -> Running:
    return Running(f"{model}-node{n}", model, "instance", req_ids)


def test_a_whole_instance_of_the_same_version_is_adopted_with_its_old_requests() -> None:
    got = plan((node(0, inst(0, "r3", "r4")), node(1, inst(1))), {"m": restored()}, 1)
    assert got == (Adopt("m", 0, "m-node0", ("r3", "r4")), Adopt("m", 1, "m-node1"))


def test_what_cannot_be_matched_is_closed_with_its_reason() -> None:
    reports = (
        node(0, inst(0), digest="sha256:bbbb"),  # another version: dropped everywhere
        node(1, inst(1), gpu=2),  # half-loaded
        node(2, gpu=1),  # a load under way, no instance
        node(3, Running("p-1", "m", "stage"), Running("x-node3", "x", "instance")),
    )
    reports = (*reports[:3], NodeReport(3, {"m": held(1), "x": held(3)},
                                        reports[3].running))  # fmt: skip
    got = plan(reports, {"m": restored()}, 2)
    assert [type(a) for a in got] == [Drop, Release, Release, Close, Release, Close, Release]
    assert "another version" in got[0].reason
    assert "half-loaded" in got[1].reason
    assert "no instance" in got[2].reason
    assert got[3].model == "x" and "no deployment named 'x'" in got[3].reason
    # a stage of a deployment restored with no layout: its pipeline is not adopted
    assert got[5] == Close("m", 3, "p-1", "stage", got[5].reason) and "pipeline" in got[5].reason
    assert "layout is not known" in got[5].reason
    assert got[6] == Release("m", 3, got[6].reason) and "no instance" in got[6].reason
    assert not any(isinstance(a, Adopt) for a in got)


def test_at_most_max_replicas_and_the_node_slots_are_adopted() -> None:
    reports = tuple(node(n, inst(n)) for n in range(3))
    got = plan(reports, {"m": restored(max_instances=2)}, 1)
    assert [type(a) for a in got] == [Adopt, Adopt, Release]
    assert "at most 2" in got[2].reason
    # one slot per node, two deployments' instances on node 0: the first (by name) is kept
    both = NodeReport(0, {"a": held(3), "m": held(3)},
                      (inst(0, model="a"), inst(0)))  # fmt: skip
    wanted = {"a": Restored(D, 3, {0: "a-node0"}, 1), "m": restored()}
    got = plan((both,), wanted, 1)
    assert got == (Adopt("a", 0, "a-node0"), Release("m", 0, "the node has no free slot"))
    assert plan((both,), wanted, 2) == (Adopt("a", 0, "a-node0"), Adopt("m", 0, "m-node0"))


def test_another_name_is_closed_and_an_empty_node_asks_nothing() -> None:
    got = plan((node(0, Running("old-name", "m", "instance"), inst(0)),), {"m": restored()}, 1)
    assert got[0] == Close("m", 0, "old-name", "instance", got[0].reason)
    assert got[1] == Adopt("m", 0, "m-node0")
    assert plan((node(0, gpu=0),), {"m": restored()}, 1) == ()


def test_an_adopted_instance_idles_since_the_carried_quiet_time() -> None:
    assert adopted_idle_since_s(100.0, 160.0) == 100.0
    assert adopted_idle_since_s(None, 160.0) == 160.0  # no carry: the restart
    assert adopted_idle_since_s(170.0, 160.0) == 160.0  # never in the future
