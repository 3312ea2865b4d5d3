"""`surge deploy` of a model whose agent still runs another version, the drop there failed
(docs/control.md, Versions): the creation answers 409 and the CLI prints one `error:` line
with the agent's reason and the fix, exit 2; nothing is deployed, and the old version's
instance is left as it was. Following the fix (deploy again once the drop goes through)
deploys it.

Real agents and a real API server (the app `surge serve` runs, in this process so that the
drop on node 0 can fail as a stuck agent's would: `agent_models.drop_model`'s timeout), the CLI as
a user runs it (a subprocess, killed by its PID past its bound)."""

import asyncio
import logging
import socket
import sys

import pytest

from surge.api.app import create_app
from surge.control.controller import Controller, ControllerConfig
from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.protocol import DropModelOp
from tests.conftest import REPO
from tests.control.strategy_run import local_cluster
from tests.control.test_versions import MODEL, held_digests, hold_old_version

CLI_TIMEOUT_S = 120.0


async def _surge(*args: str) -> tuple[int, str, str]:
    """The CLI in a subprocess: (exit code, stdout, stderr); killed by PID past its bound."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "surge.cli", *args, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.timeout(300)
def test_deploy_over_a_running_other_version_is_one_error_line(
    tmp_path, tiny_store_dir, caplog
) -> None:
    import uvicorn

    hf = create_tiny_model(tmp_path / "hf2", TinyModelConfig(seed=1))
    v2_store = tmp_path / "v2"
    import_checkpoint(hf, v2_store, name=MODEL, progress=False)
    v1, v2 = read_manifest(tiny_store_dir), read_manifest(v2_store)
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)
    cfg = ControllerConfig(state_dir=state, nodes=2, tick_s=0.05)

    async def run() -> tuple[tuple[int, str, str], dict[int, str], tuple[int, str, str]]:
        ctl = Controller(cfg, cluster.addresses, cluster.token)
        await ctl.start()
        # after the start (a restart closes what no deployment names): node 0 holds and runs
        # version 1, as an old controller or a failed delete left it
        link = state / "registry" / MODEL
        link.symlink_to(tiny_store_dir, target_is_directory=True)  # version 1, for its load
        await hold_old_version(cluster, v1)
        link.unlink()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(ctl), log_level="warning"))
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                assert not task.done(), "the API server did not start"
                await asyncio.sleep(0.05)
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            call_bytes = ctl.client.call_bytes

            async def stuck_drop(node: int, op: object, *a: object, **kw: object) -> object:
                if isinstance(op, DropModelOp):
                    raise TimeoutError  # as `_drop`'s bound on a stuck agent ends it
                return await call_bytes(node, op, *a, **kw)

            ctl.client.call_bytes = stuck_drop  # type: ignore[method-assign]
            deploy = ("deploy", MODEL, "--model", str(v2_store), "--url", url)
            refused = await _surge(*deploy)
            held = await held_digests(cluster)
            assert MODEL not in ctl.deployments
            ctl.client.call_bytes = call_bytes  # type: ignore[method-assign]
            return refused, held, await _surge(*deploy)  # the fix: deploy again
        finally:
            server.should_exit = True
            await task
            sock.close()
            await ctl.stop()

    with cluster, caplog.at_level(logging.WARNING):
        (rc, out, err), held, (rc2, out2, err2) = asyncio.run(run())
        after = asyncio.run(held_digests(cluster))
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, (rc, out, err)
    line = lines[0]
    assert line.startswith("error: ") and line.endswith("(HTTP 409)"), line
    for words in (f"node 0 runs {MODEL}-node0", "close it", "then deploy again"):
        assert words in line, (words, line)
    assert "Traceback" not in err
    # the controller's log says why the drop failed (was an empty reason for a timeout)
    assert f"{MODEL}: not dropped on node 0: TimeoutError()" in caplog.text, caplog.text
    assert held[0] == v1.digest  # the old version's instance left as it was
    assert rc2 == 0 and out2.startswith(f"deployed {MODEL} "), (rc2, out2, err2)
    assert set(after.values()) == {v2.digest}, after
