"""The README's test command is the one .ci/run runs (issue 31: CI runs what users run)."""

import re

from tests.conftest import REPO


def test_ci_runs_the_readmes_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    (command,) = re.findall(r"^(\.venv/bin/python -m pytest .*?)\s+# the tests", readme, re.M)
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(command) for line in ci), [ln for ln in ci if "pytest" in ln]
    # Parallel workers for most tests, the wall-clock `serial` tests alone afterwards.
    assert '-m "not serial"' in command and "-m serial" in command and "-n 2" in command
