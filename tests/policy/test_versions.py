"""`policy.versions`: what a register of another version does, which copies count as the
deployment's, which nodes drop another version before a deployment registers, which holder
may be a source."""

from surge.policy.versions import (
    decide_register,
    other_versions,
    refuse_as_source,
    same_version,
)

V1 = "sha256:" + "1" * 64
V2 = "sha256:" + "2" * 64


def test_a_register_learns_keeps_replaces_or_refuses() -> None:
    assert decide_register("m", 0, None, V1, ()).action == "new"
    assert decide_register("m", 0, V1, V1, ("m-node0",)).action == "same"
    replace = decide_register("m", 3, V1, V2, ())
    assert replace.action == "replace"
    assert replace.reason == f"model 'm' replaced on node 3: {V1[:19]} -> {V2[:19]}"
    refuse = decide_register("m", 3, V1, V2, ("m-node3", "pipe-a"))
    assert refuse.action == "refuse"
    assert refuse.reason.startswith(f"node 3 runs m-node3, pipe-a on version {V1[:19]} of model")
    assert "close them (instance_close / stage_close) or drop the model" in refuse.reason


def test_a_copy_counts_only_at_its_own_version() -> None:
    assert same_version(V1, V1)
    assert not same_version(V2, V1)
    assert not same_version("", V1) and not same_version(None, V1)
    assert other_versions({0: V1, 1: V2, 2: "", 4: V1}, V1) == (1, 2)


def test_a_holder_of_another_version_is_no_source() -> None:
    assert refuse_as_source("m", 0, V1, V1) is None
    assert refuse_as_source("m", 0, V1, "") is None  # a caller that does not say
    why = refuse_as_source("m", 0, V1, V2)
    assert why == (
        f"node 0 holds version {V1[:19]} of model 'm', not {V2[:19]}: a copy of another "
        "version is no source of it"
    )
