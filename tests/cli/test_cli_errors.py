"""The CLI paths issue 36 found ending in a traceback (or silently wrong): each is one
`error:` line with the fix and exit 2; and `surge --version`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import surge
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import run_surge


def test_version() -> None:
    proc = run_surge("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"surge {surge.__version__}"


@pytest.fixture(scope="module")
def tiny_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A surge home whose default model is the tiny one (context 2048), made here, whatever
    this machine's setup imported (SmolLM2's context of 8192 would run 5,000 tokens)."""
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "SURGE_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-c", "from surge.model.default_store import default_store as d; d()"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("plan", "multicast", "--nodes", "4", "--blocks", "4", "--png", "/nonexistent/d/x.png"),
         ["--png", "/nonexistent/d does not exist"]),
        (("simulate", "--trace", "gamma:rate=1e9", "--json", "/nonexistent/d/x.json"),
         ["--json", "does not exist"]),
        (("simulate", "--trace", "gamma:rate=1e9"), ["requests", "lower rate= or duration="]),
        (("model", "create-tiny", "OUT", "--hidden", "100000", "--layers", "100"),
         ["parameters", "GB available", "smaller --hidden"]),
        (("model", "create-tiny", "/proc/surge-x"), ["cannot create /proc/surge-x", "writable"]),
        (("generate", "--prompt", "x", "--temperature", "nan"), ["temperature", "nan"]),
        (("generate", "--prompt-token-ids", "1,,2"), ["empty item at position 2"]),
        (("generate", "--prompt", "x", "--max-tokens", "5000"),
         ["exceeds the model's context of 2048", "--max-tokens 2047 or fewer"]),
    ],
)  # fmt: skip
def test_one_error_line_each(tmp_path: Path, tiny_home: Path, args, words) -> None:
    args = tuple(str(tmp_path / "out") if a == "OUT" else a for a in args)
    env = {**os.environ, "SURGE_HOME": str(tiny_home)}
    assert_one_line_error(run_surge(*args, env=env), *words)
    assert not (tmp_path / "out").exists()


def test_a_truncated_checkpoint_is_one_error_line(tiny_hf: Path, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf, hf)
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    proc = run_surge("model", "import", str(hf), str(tmp_path / "store"), "-q")
    assert_one_line_error(proc, "not a readable safetensors file", "is it complete?")


def test_a_manifest_naming_a_file_outside_its_store_says_nothing_about_it(
    tiny_store: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"x" * 12345)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["blocks"][0]["file"] = "../secret.bin"
    (store / "manifest.json").write_text(json.dumps(manifest))
    proc = run_surge("model", "inspect", str(store), "--verify")
    assert_one_line_error(proc, "not a file inside the store", "import the model again")
    assert "12345" not in proc.stderr


def test_a_bad_compile_decode_environment_is_one_error_line(tmp_path: Path) -> None:
    env = {**os.environ, "SURGE_COMPILE_DECODE": "maybe", "SURGE_TOKEN": "t" * 32}
    args = ("node", "run", "--node-id", "0", "--port", "0", "--disk-dir", str(tmp_path))
    proc = run_surge(*args, env=env)
    assert_one_line_error(proc, "SURGE_COMPILE_DECODE", "0/false/off")


@pytest.mark.parametrize(
    "args",
    [("status",), ("delete", "x"), ("deploy", "x", "--model", "/tmp")],
)
def test_a_thin_client_pointed_at_another_service_is_one_line(args) -> None:
    """Something else on the port (a wrong --url or $SURGE_URL): `surge status` ended in a
    TypeError traceback, delete/deploy printed the other service's HTML page as the error."""
    import http.server
    import threading

    class Other(http.server.BaseHTTPRequestHandler):
        def _page(self) -> None:
            body = b"<!DOCTYPE html>\n<html>\n<p>not surge</p>\n</html>\n"
            self.send_response(200 if self.command == "GET" else 501)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _page

        def log_message(self, *a) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        proc = run_surge(*args, "--url", url, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert_one_line_error(proc, url, "not as surge does", "--url")


def test_a_file_that_is_not_gguf_is_named_as_such(tmp_path: Path) -> None:
    """It was told "is not a directory; give the path of a HF checkpoint"."""
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"<html>not a model</html>")
    proc = run_surge("model", "import", str(bad), str(tmp_path / "store"))
    assert_one_line_error(proc, "model.gguf is a file but not a GGUF file", ".gguf file")
    assert not (tmp_path / "store").exists()


def test_a_thin_client_whose_server_is_slow_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that took the request and has not answered yet (a large checkpoint importing)
    was "cannot reach surge ...; is `surge serve` running?"."""
    import socket

    from surge.cli import deploy
    from surge.errors import SurgeError

    monkeypatch.setattr(deploy, "TIMEOUT_S", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(SurgeError) as e:
            deploy.status(as_json=False, url=url, api_key=None)
    msg = str(e.value)
    assert "did not answer GET /v1/deployments within 0.5 s" in msg and "cannot reach" not in msg


NODE_FLAG_ERRORS = {
    "log-level": (("--log-level", "verbose"), "--log-level must be one of debug, info"),
    "port": (("--port", "99999"), "--port must be 0..65535 (got 99999)"),
    "disk-dir": (("--disk-dir", "/proc/surge-x/d"), "--disk-dir /proc/surge-x/d cannot be used"),
}
"""`surge node run` flags that ended in a traceback after the agent's flags were read."""


@pytest.mark.parametrize("case", sorted(NODE_FLAG_ERRORS))
def test_node_run_flags_are_one_error_line(tmp_path: Path, case: str) -> None:
    args, words = NODE_FLAG_ERRORS[case]
    flags = {"--node-id": "0", "--disk-dir": str(tmp_path / "disk")}
    flags.update(zip(args[::2], args[1::2], strict=True))
    env = {**os.environ, "SURGE_TOKEN": "0123456789abcdef0123"}
    proc = run_surge("node", "run", *[x for kv in flags.items() for x in kv], env=env, timeout=60)
    assert_one_line_error(proc, words)


def test_node_certs_into_a_directory_that_cannot_be_made_is_one_error_line() -> None:
    proc = run_surge("node", "certs", "/proc/surge-x/certs", timeout=60)
    assert_one_line_error(proc, "OUT_DIR /proc/surge-x/certs cannot be used", "writable")


def test_delete_of_a_name_no_deployment_can_have_sends_nothing(tmp_path: Path) -> None:
    """`surge delete 'm?x=1'` sent DELETE /v1/deployments/m?x=1: deployment m was deleted."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_DELETE(self) -> None:
            seen.append(self.path)
            body = b'{"deleted": "m"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for name in ("m?x=1", "../models/m", "a/b"):
            proc = run_surge("delete", name, "--url", url, timeout=60)
            assert_one_line_error(proc, f"no deployment can be named {name!r}")
        assert seen == []
        assert run_surge("delete", "m", "--url", url, timeout=60).returncode == 0
        assert seen == ["/v1/deployments/m"]
    finally:
        server.shutdown()


@pytest.mark.parametrize("flag", ["--hold-timeout-s", "--keep-alive-s", "--ttft-ms"])
def test_deploy_with_a_non_finite_number_is_one_error_line(flag: str) -> None:
    """JSON carries no NaN: httpx's ValueError traceback before (nothing listens on :9)."""
    proc = run_surge("deploy", "x", "--model", "/m", flag, "nan", "--url", "http://127.0.0.1:9")
    assert_one_line_error(proc, f"{flag} must be a finite number (got nan)")
