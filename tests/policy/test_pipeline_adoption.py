"""`policy.adoption` for pipelines (`policy.pipeline_adoption`): a restarted controller adopts
an old controller's execution pipeline whole, as the one serving instance the controller would
have built over its stages' nodes, only when every stage of the store's version is there,
end to end and loaded; a missing, half-loaded or mismatched stage closes it, with the reason."""

from surge.policy.adoption import (
    Adopt,
    AdoptPipeline,
    Close,
    Drop,
    HeldModel,
    NodeReport,
    Release,
    Restored,
    Running,
    plan,
)
from surge.policy.pipeline_adoption import stage_blocks

D = "sha256:aaaa"
LAYERS = ((0, 2), (2, 4), (4, 6), (6, 8))
"""Four blocks of two layers each (the embedding in block 0, the head in block 3)."""
PIPE = "m-pipe0-abc"


def restored(max_instances: int = 4) -> Restored:
    return Restored(D, 4, {n: f"m-node{n}" for n in range(4)}, max_instances, LAYERS)


def stage(first: int, end: int, nxt: int | None, *seq_ids: int, name: str = PIPE) -> Running:
    return Running(name, "m", "stage", (), first, end, nxt, None, seq_ids)


def node(n: int, blocks: tuple[int, ...], *running: Running, digest: str = D) -> NodeReport:
    return NodeReport(n, {"m": HeldModel(digest, frozenset(blocks))}, running)


def two_stages(head_blocks=(0, 1), tail_blocks=(2, 3), tail_first=4, tail_digest=D):
    return (
        node(0, head_blocks, stage(0, 4, 1, 0, 1)),
        node(1, tail_blocks, stage(tail_first, 8, None, 0, 1, 1 << 40), digest=tail_digest),
    )


def test_a_whole_pipeline_is_adopted_as_one_instance_with_its_old_sequences() -> None:
    reports = (*two_stages(), node(2, (0, 1, 2, 3), Running("m-node2", "m", "instance")))
    got = plan(reports, {"m": restored()}, 1)
    assert got == (
        Adopt("m", 2, "m-node2"),
        AdoptPipeline("m", PIPE, ((0, 0, 4), (1, 4, 8)), (0, 1, 1 << 40)),
    )
    assert got[1].nodes == (0, 1)
    # the stages as their nodes hand on, whatever order the agents answer in
    assert plan(tuple(reversed(reports)), {"m": restored()}, 1) == got


def test_a_missing_stage_closes_the_pipeline() -> None:
    head, _ = two_stages()
    got = plan((head, node(1, (2, 3))), {"m": restored()}, 1)
    assert [type(a) for a in got] == [Release, Close, Release]
    assert got[0] == Release("m", 1, "a device copy with no instance (a load under way)")
    assert got[1] == Close("m", 0, PIPE, "stage", got[1].reason)
    assert "a stage is missing: node 0's hands on to node 1, which has none" in got[1].reason
    assert got[2].node == 0 and "pipeline's stages closed" in got[2].reason
    # the last stage alone: nothing starts at layer 0
    _, tail = two_stages()
    got = plan((node(0, (0, 1)), tail), {"m": restored()}, 1)
    assert "none starts at layer 0" in next(a for a in got if isinstance(a, Close)).reason


def test_another_version_closes_the_pipeline() -> None:
    got = plan(two_stages(tail_digest="sha256:bbbb"), {"m": restored()}, 1)
    assert [type(a) for a in got] == [Drop, Close, Release]
    assert got[0].node == 1 and "another version" in got[0].reason  # every copy dropped there
    assert got[1] == Close("m", 0, PIPE, "stage", got[1].reason)
    assert "node 1's stage runs another version" in got[1].reason
    assert got[2].node == 0


def test_a_stage_order_gap_closes_the_pipeline() -> None:
    got = plan(two_stages(tail_first=6), {"m": restored()}, 1)
    closes = [a for a in got if isinstance(a, Close)]
    assert [(a.node, a.name) for a in closes] == [(0, PIPE), (1, PIPE)]
    assert all("stage order gap: node 0's ends at layer 4, the next (node 1) starts at 6"
               in a.reason for a in closes)  # fmt: skip
    assert [a.node for a in got if isinstance(a, Release)] == [0, 1]
    assert not any(isinstance(a, AdoptPipeline) for a in got)


def test_half_loaded_live_and_no_room_close_it() -> None:
    got = plan(two_stages(tail_blocks=(2,)), {"m": restored()}, 1)
    assert "half-loaded: node 1 lacks blocks [3] of its layers 4-7" in got[0].reason
    live = (node(0, (0, 1), Running("live-1", "m", "stage", (), 0, 4, 1, "live-m")),
            node(1, (2, 3), Running("live-1", "m", "stage", (), 4, 8, None, "live-m")))  # fmt: skip
    assert "a live prefill's stage" in plan(live, {"m": restored()}, 1)[0].reason
    # the one instance allowed is a local one (decided first); a node's only slot taken
    full = (*two_stages(), node(2, (0, 1, 2, 3), Running("m-node2", "m", "instance")))
    got = plan(full, {"m": restored(max_instances=1)}, 1)
    assert got[0] == Adopt("m", 2, "m-node2") and "at most 1" in got[1].reason
    other = NodeReport(0, {"m": HeldModel(D, frozenset({0, 1})), "a": HeldModel(D, frozenset({0}))},
                       (stage(0, 4, 1), Running("a-node0", "a", "instance")))  # fmt: skip
    a = Restored(D, 1, {0: "a-node0"}, 1)
    got = plan((other, two_stages()[1]), {"m": restored(), "a": a}, 1)
    assert "node 0 has no free slot" in got[1].reason
    # a node running the deployment's local instance serves in no pipeline of it
    got = plan((node(0, (0, 1, 2, 3), stage(0, 4, 1), Running("m-node0", "m", "instance")),
                two_stages()[1]), {"m": restored()}, 1)  # fmt: skip
    assert got[0] == Adopt("m", 0, "m-node0") and "serves the deployment otherwise" in got[1].reason


def test_a_stage_needs_its_layers_blocks_and_the_ends_theirs() -> None:
    assert stage_blocks(LAYERS, 0, 4) == [0, 1]
    assert stage_blocks(LAYERS, 3, 5) == [1, 2]
    assert stage_blocks(LAYERS, 4, 8) == [2, 3]
    assert stage_blocks(((0, 0), (0, 2), (2, 2)), 0, 2) == [0, 1, 2]  # embed and head blocks
