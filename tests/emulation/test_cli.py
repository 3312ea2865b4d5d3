"""`surge serve --emulate` refuses bad settings with one `error:` line naming the valid
choices, exit 2, before any agent starts."""

from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_surge


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--emulate", "lambdascale-testbed1"], ["PRESET:MODEL", "paraserve-1", "llama2-13b"]),
        (["--emulate", "nope:llama2-13b"], ["unknown emulation preset", "lambdascale-testbed1"]),
        (["--emulate", "paraserve-1:gpt"], ["unknown emulated model", "llama2-7b"]),
        (["--time-dilation", "2"], ["--time-dilation needs --emulate"]),
        (["--emulate", "paraserve-1:llama2-7b", "--time-dilation", "0"], ["(0, 1000]"]),
        (["--emulate", "paraserve-1:llama2-7b", "--link-gbps", "1"], ["drop --link-gbps"]),
        (["--emulate", "paraserve-1:llama2-7b", "--launcher", "ray"], ["--launcher local"]),
    ],
)
def test_bad_emulation_flags_are_one_error_line(tmp_path: Path, flags, fragments) -> None:
    proc = run_surge("serve", "--port", "0", "--state-dir", str(tmp_path), *flags, timeout=60)
    assert_one_line_error(proc, *fragments)


def test_the_served_model_must_fit_and_the_nodes_must_exist(tmp_path: Path, tiny_store) -> None:
    base = ["serve", "--port", "0", "--state-dir", str(tmp_path), "--model", str(tiny_store)]
    proc = run_surge(*base, "--emulate", "paraserve-1:llama2-70b", "--nodes", "1")
    assert_one_line_error(proc, "does not fit one A10")
    proc = run_surge(*base, "--emulate", "lambdascale-testbed1:llama2-7b", "--nodes", "13")
    assert_one_line_error(proc, "has 12 GPUs", "--nodes 1..12")
    proc = run_surge(
        "serve", "--port", "0", "--state-dir", str(tmp_path), "--model", str(tmp_path),
        "--emulate", "lambdascale-testbed1:llama2-7b", "--nodes", "1",
    )  # fmt: skip
    assert_one_line_error(proc, "is neither a surge store")
