"""`surge serve`'s settings that used to fail open or clash (issue 36): an empty API key is an
error, not "no auth"; each clone gets its own state directory; an unusable state directory
or config path is one `error:` line, before any agent starts. The stall timeout is one
setting (`ControllerConfig.stall_timeout_s`): from the config file or the flag to every agent;
out of range, one `error:` line."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from surge.cli.serve_config import controller_config, load_config
from surge.control.launching import launch_cluster
from surge.runtime.launch.agent_process import agent_argv
from surge.runtime.launch.local import LocalCluster
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import REPO, run_surge


def surge_serve(tmp: Path, *args: str, **env: str):
    """`surge serve` as a user runs it, on a free port with one node, its state and home under
    `tmp` (a subprocess, 60 s at most); shared with `test_compile_settings.py`."""
    state = ["--state-dir", str(tmp / "state")] if "--state-dir" not in args else []
    return run_surge(
        "serve", "--port", "0", "--nodes", "1", *state, *args,
        env={**os.environ, "SURGE_HOME": str(tmp / "home"), **env},
        timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (("--api-key", ""), {}, "--api-key is empty"),
        (("--api-key", "  "), {}, "--api-key is empty"),
        ((), {"SURGE_API_KEY": ""}, "$SURGE_API_KEY is empty"),
    ],
)
def test_an_empty_api_key_is_an_error_not_no_auth(tmp_path: Path, args, env, words) -> None:
    proc = surge_serve(tmp_path, *args, **env)
    assert_one_line_error(proc, words, "leave it unset")
    assert not (tmp_path / "state").exists(), "the server started"


def test_an_empty_api_key_in_the_config_is_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api_key: ''\n")
    env = {k: v for k, v in os.environ.items() if k != "SURGE_API_KEY"}
    proc = run_surge(
        "serve", "--port", "0", "--config", str(cfg), "--state-dir", str(tmp_path / "s"),
        env={**env, "SURGE_HOME": str(tmp_path)}, timeout=60,
    )  # fmt: skip
    assert_one_line_error(proc, "the config's api_key is empty")


def test_unusable_state_dir_and_config_paths_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(
        surge_serve(tmp_path, "--state-dir", "/proc/surge-state"), "cannot be used", "writable"
    )
    assert_one_line_error(surge_serve(tmp_path, "--config", "/dev/zero"), "is not a regular file")


@pytest.mark.parametrize("source", ["flag", "config"])
def test_a_stall_timeout_out_of_range_is_one_line(tmp_path: Path, source: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("stall_timeout_s = 2\n" if source == "config" else "")
    args = ("--stall-timeout-s", "2") if source == "flag" else ()
    proc = surge_serve(tmp_path, "--config", str(cfg), *args)
    assert_one_line_error(proc, "stall_timeout_s (--stall-timeout-s)", "3 to 3600 s (got 2)")
    assert not (tmp_path / "state").exists(), "the server started"


def test_a_stall_timeout_from_the_config_file_reaches_the_agents(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("stall_timeout_s: 4.5\n")
    cfg = {**load_config(cfg_file), "cluster_settings": {}}
    ccfg = controller_config(cfg, 2)
    assert ccfg.stall_timeout_s == 4.5
    cluster = launch_cluster(ccfg, tmp_path / "registry")
    assert isinstance(cluster, LocalCluster)
    for node in range(2):
        argv = agent_argv(cluster.agent_config(node))
        assert argv[argv.index("--stall-timeout-s") + 1] == "4.5"


def test_each_clone_has_its_own_default_state_dir(tmp_path: Path) -> None:
    home = tmp_path / "home"
    found = []
    for clone in ("a/surge-checkout", "b/surge-checkout"):
        shutil.copytree(REPO / "surge", tmp_path / clone / "surge",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        code = "from surge.cli.serve_config import default_state_dir; print(default_state_dir())"
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(tmp_path / clone), "SURGE_HOME": str(home)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        found.append(Path(out))
    assert found[0] != found[1], found
    for p in found:
        assert p.parent == home / "serve" and p.name.startswith("surge-checkout-"), p


def test_the_api_socket_turns_nagle_off() -> None:
    """Accepted API connections have TCP_NODELAY (a listening socket made with proto 0 got
    none from asyncio, and every multi-write response waited ~40 ms for a delayed ACK)."""
    import asyncio
    import socket

    from surge.cli.listener import bind_listener

    sock = bind_listener("127.0.0.1", 0)
    got: dict[str, int] = {}

    async def run() -> None:
        async def handle(reader, writer) -> None:
            got["nodelay"] = writer.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY
            )
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            _, w = await asyncio.open_connection(*sock.getsockname()[:2])
            for _ in range(50):
                if "nodelay" in got:
                    break
                await asyncio.sleep(0.02)
            w.close()

    asyncio.run(run())
    assert got.get("nodelay") == 1


@pytest.mark.parametrize(
    ("args", "words"),
    [
        # --name without --model was ignored: the default model started under its own name.
        (("--name", "mine"), ["--name names the deployment of --model", "give --model"]),
        # A host that does not resolve said "Unknown error -2" (getaddrinfo's errno).
        (("--host", "256.1.1.1"), ["cannot listen on 256.1.1.1:0", "not known"]),
    ],
)
def test_serve_flags_that_cannot_work_are_one_line(tmp_path: Path, args, words) -> None:
    assert_one_line_error(surge_serve(tmp_path, *args), *words)
    assert not (tmp_path / "state").exists(), "the server started"


def test_a_stored_deployment_asked_for_with_another_model_is_one_line(
    tmp_path: Path, tiny_store: Path
) -> None:
    """`surge serve --model B --name m` where the state directory keeps `m` serving A: A was
    restored and B dropped without a word (the user believed B served)."""
    from surge.control.spec import DeploymentSpec
    from surge.control.store import DeploymentStore

    state = tmp_path / "state"
    store = DeploymentStore(state / "deployments.sqlite")
    store.add(DeploymentSpec.from_json({"name": "m", "model": str(tiny_store)}))
    store.close()
    other = tmp_path / "other"
    shutil.copytree(tiny_store, other)
    proc = surge_serve(tmp_path, "--model", str(other), "--name", "m", "--state-dir", str(state))
    assert_one_line_error(proc, "deployment 'm' is stored", "another model", "surge delete m")


def test_a_model_that_is_no_store_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """`surge serve --model X` with X neither a store nor a checkpoint: one line before the
    port binds (it used to come once the agents had started); a GGUF file gets the import."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    for model, words in (
        (tmp_path / "nope", ["is neither a surge store", "nope"]),
        (gguf, ["import it first: surge model import", "m.gguf STORE_DIR"]),
    ):
        proc = surge_serve(tmp_path, "--model", str(model))
        assert_one_line_error(proc, *words)
        assert not (tmp_path / "state").exists(), "the server started"
