"""`surge.cli.serve_process`: a `surge serve` child awaited until ready; one that fails to
start is a `SurgeError` carrying its own error line, and is not left running."""

from pathlib import Path

import psutil
import pytest

from surge.cli.serve_process import start_serve
from surge.errors import SurgeError
from tests.conftest import REPO


@pytest.mark.parametrize("own_session", [False, True])
def test_a_server_that_exits_is_an_error_with_its_log(tmp_path: Path, own_session: bool) -> None:
    args = ["--port", "0", "--nodes", "0", "--state-dir", str(tmp_path / "s")]
    with pytest.raises(SurgeError, match=r"exited 2: error: --nodes must be >= 1"):
        start_serve(args, tmp_path / "serve.log", cwd=REPO, own_session=own_session)
    assert not psutil.Process().children(), "the failed server is reaped"


def test_a_server_not_ready_in_time_is_killed(tmp_path: Path) -> None:
    args = ["--port", "0", "--nodes", "1", "--state-dir", str(tmp_path / "s")]
    with pytest.raises(SurgeError, match="not ready within 0 s"):
        start_serve(args, tmp_path / "serve.log", cwd=REPO, own_session=True, timeout_s=0.3)
    assert not psutil.Process().children(), "the server is killed and reaped"
