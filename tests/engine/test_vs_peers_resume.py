"""`benchmarks.engine.vs_peers --resume`: a subset run replaces the rows it measured again
and keeps the others (a full run does not fit one quiet sitting)."""

from benchmarks.engine.vs_peers import merged, row_key


def _row(model: str, threads: object, batch: int, when: str) -> dict:
    return {"model": model, "threads": threads, "shape": "decode", "batch": batch,
            "prompt_len": 64, "measured_utc": when}  # fmt: skip


def test_a_resumed_run_replaces_what_it_measured_and_keeps_the_rest() -> None:
    old = [_row("smollm2", "default", 1, "08:31"), _row("smollm2", 1, 8, "08:31")]
    new = [_row("smollm2", 1, 8, "10:45"), _row("100mb", "default", 32, "10:45")]
    out = merged(old, new, row_key)
    assert len(out) == 3
    by_key = {row_key(r): r["measured_utc"] for r in out}
    assert by_key[("smollm2", "1", "decode", 8, 64)] == "10:45"  # re-measured: the new row
    assert by_key[("smollm2", "default", "decode", 1, 64)] == "08:31"  # kept
    assert by_key[("100mb", "default", "decode", 32, 64)] == "10:45"


def test_nothing_old_is_lost_when_nothing_new_is_measured() -> None:
    old = [_row("smollm2", "default", 1, "08:31")]
    assert merged(old, [], row_key) == old


def test_rows_sort_by_number_not_by_text() -> None:
    rows = [_row("100mb", "default", 32, "t"), _row("100mb", "default", 8, "t")]
    assert [r["batch"] for r in merged([], rows, row_key)] == [8, 32]  # "32" < "8" as text
