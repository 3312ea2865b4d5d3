"""`policy.versions`: what a register of another version does, which copies count as the
deployment's, which nodes drop another version before a deployment registers, which holder
may be a source, whose K/V and pipeline an instance or stage takes, what a restored deployment
says of its version."""

from surge.policy.versions import (
    decide_register,
    decide_restore,
    is_kv_refusal,
    other_versions,
    refuse_as_source,
    refuse_kv,
    refuse_stage,
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


def test_kv_is_taken_only_from_its_own_version() -> None:
    assert refuse_kv("m", 1, V2, V2) is None
    why = refuse_kv("m", 1, V2, V1)
    assert why == (
        f"node 1 runs version {V2[:19]} of model 'm'; K/V of another version ({V1[:19]}) is "
        "refused: decoding on it would be garbage (prefill again)"
    )
    assert refuse_kv("m", 1, V2, "") is not None  # K/V that does not say: no checksum catches it
    assert is_kv_refusal(f"agent 1: instance_adopt: {why}")
    assert not is_kv_refusal("no room for request r1") and not is_kv_refusal(str(None))


def test_a_stage_opens_only_at_its_pipelines_version() -> None:
    assert refuse_stage("m", 0, V1, V1) is None and refuse_stage("m", 0, V1, "") is None
    assert refuse_stage("m", 0, V1, V2) == (
        f"node 0 holds version {V1[:19]} of model 'm', not {V2[:19]}: a stage of another "
        "version would run on garbage hidden states"
    )


def test_a_restore_serves_the_stores_version_and_says_when_it_changed() -> None:
    assert decide_restore("d", V1, V1) == decide_restore("d", "", V1)
    assert decide_restore("d", V1, V1).digest == V1 and decide_restore("d", "", V1).warning == ""
    replaced = decide_restore("d", V1, V2)
    assert replaced.digest == V2
    assert replaced.warning.startswith(f"deployment 'd' served version {V1[:19]} before the")
