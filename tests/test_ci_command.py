"""README.md opens with exactly three commands: the set-up on a fresh machine, the main job on
the embedded default (a local cluster of agents serving a real small model), and the tests;
.ci/run runs that same set-up and that same test command (issue 31: CI runs what users run)."""

import os
import re

from tests.conftest import REPO

SETUP, MAIN_JOB = "./setup.sh", ".venv/bin/surge serve"


def opening_commands() -> list[tuple[str, str]]:
    """(command, comment) of each line of the README's first fenced block, before any section."""
    head = (REPO / "README.md").read_text().split("\n## ", 1)[0]
    found = re.search(r"^```bash\n(.*?)^```", head, re.M | re.S)
    assert found, "README.md opens with a ```bash block of its commands"
    out = []
    for line in found.group(1).splitlines():
        if line.strip():
            command, _, comment = line.partition("  # ")
            out.append((command.strip(), comment.strip()))
    return out


def test_readme_opens_with_setup_main_job_and_tests() -> None:
    commands = opening_commands()
    assert [c for c, _ in commands][:2] == [SETUP, MAIN_JOB], commands
    assert len(commands) == 3, commands
    setup, main_job, tests = (comment for _, comment in commands)
    assert "set up on a fresh machine" in setup and "main job" in main_job
    assert tests.startswith("the tests"), tests
    assert os.access(REPO / "setup.sh", os.X_OK)
    # The main job is the embedded default: no model, no flags (surge serve deploys the default
    # model on 4 local agents; tests/cli covers what it serves).
    assert commands[1][0].split() == [".venv/bin/surge", "serve"]


def test_ci_runs_the_readmes_setup_and_test_command() -> None:
    ((command, _),) = opening_commands()[2:]
    assert command.startswith(".venv/bin/python -m pytest ")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert SETUP in ci, "CI sets up as a user does"
    assert any(line.startswith(command) for line in ci), [ln for ln in ci if "pytest" in ln]
    # Parallel workers for most tests, the wall-clock `serial` tests alone afterwards.
    assert '-m "not serial"' in command and "-m serial" in command and "-n 2" in command
