"""`surge simulate`'s own JSON files (--model FILE.json, --cluster FILE.json, --scenario
FILE.json): a bad one is one `error:` line, exit 2 (a JSONDecodeError, KeyError,
ZeroDivisionError or RecursionError traceback before)."""

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_surge

GAMMA = "gamma:rate=1,cv=1,duration=5"
SHAPE = {"num_layers": 2, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
         "context_tokens": 256}  # fmt: skip


@pytest.mark.parametrize(
    ("flag", "text", "words"),
    [
        ("--model", "{bad", ["model file", "is not valid JSON"]),
        ("--model", "[1]", ["must hold one JSON object"]),
        ("--model", json.dumps({"name": "x"}), ["needs the integers num_layers"]),
        ("--model", json.dumps(SHAPE | {"num_key_value_heads": 0}), ["sizes must be >= 1"]),
        ("--model", "[" * 100_000, ["is not valid JSON"]),
        ("--cluster", "[" * 100_000, ["cluster file", "is not valid JSON"]),
        ("--scenario", "[" * 100_000, ["scenario file", "is not valid JSON"]),
    ],
)
def test_a_bad_simulator_file_is_one_error_line(tmp_path: Path, flag, text, words) -> None:
    f = tmp_path / "x.json"
    f.write_text(text)
    args = [flag, str(f)] if flag == "--scenario" else ["--trace", GAMMA, flag, str(f)]
    assert_one_line_error(run_surge("simulate", *args, timeout=60), *words)
