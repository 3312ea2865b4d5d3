"""Processes that run no model never import torch (~1.5 s of CPU each, before any work): the
`surge` commands that only talk HTTP, plan or simulate, and `surge serve`'s own process (the
controller and the API; its agents run the models). A running `surge serve` is checked too,
in `tests/control/test_serve_openai.py` (`test_the_server_process_never_loads_torch`)."""

import json
import socket
import subprocess
import sys

from tests.conftest import REPO

# Runs each command as `surge` would (a `SurgeError` or exit ends it, as for a user), then
# imports what `surge serve` imports in its own process (`cli/serve.py: _run_server`), and
# says which of the commands left torch imported.
PROBE = """
import json, sys
from surge.cli.main import app
from surge.errors import SurgeError

out = {}
for argv in json.loads(sys.argv[1]):
    try:
        app(argv, prog_name="surge")
    except (SystemExit, SurgeError):
        pass
    out[" ".join(argv)] = "torch" in sys.modules
import uvicorn
import surge.api.app, surge.control.controller, surge.model.default_store
out["surge serve's own imports"] = "torch" in sys.modules
print(json.dumps(out))
"""


def _closed_port_url() -> str:
    with socket.socket() as s:  # bound, never listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_commands_that_need_no_model_do_not_import_torch(tmp_path) -> None:
    url = _closed_port_url()
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.0,64,4\n0.1,64,4\n")
    commands = [
        ["--help"],
        ["status", "--url", url],
        ["deploy", "m", "--model", str(tmp_path), "--url", url],
        ["delete", "m", "--url", url],
        ["plan", "multicast", "--nodes", "5", "--blocks", "3", "--json"],
        ["simulate", "--trace", str(trace), "--system", "ideal", "--json", str(tmp_path / "o")],
    ]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(imported) == len(commands) + 1
    assert not any(imported.values()), f"torch imported by: {imported}"
    assert (tmp_path / "o").is_file(), "the simulation ran (not only its argument checks)"
