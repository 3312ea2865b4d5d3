"""Bounded intake (issue 36): a body over the limit is a 413 before or while it is read and is
never buffered; a text prompt too long for any tokenization is refused before tokenizing."""

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control.conftest import Serve, start_serve

MODEL = "tiny"
LIMIT_BYTES = 1 << 20

# One xdist worker runs every test of this module: the module's `surge serve` then starts once,
# not once on each worker that draws one of its tests.
pytestmark = pytest.mark.xdist_group("intake")


@pytest.fixture(scope="module")
def server(tmp_path_factory, surge_home: Path, tiny_store_dir: Path) -> Iterator[Serve]:
    config = {
        "nodes": 1,
        "max_body_mb": LIMIT_BYTES / (1 << 20),
        "deployments": [{"name": MODEL, "model": str(tiny_store_dir)}],
    }
    s = start_serve(tmp_path_factory.mktemp("intake"), surge_home, config)
    yield s
    s.stop()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _raw(server: Serve, head: str) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(head.encode())
    return s


def _response(s: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        part = s.recv(65536)
        if not part:
            break
        data += part
    return data.decode(errors="replace")


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_a_declared_huge_body_is_413_at_once_without_being_sent(server: Serve) -> None:
    size = 300 * 10**6
    t0 = time.monotonic()
    with _raw(
        server,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n" + '{"model": "tiny", "prompt": "',
    ) as s:
        reply = _response(s)  # the old server waited for 300 MB that never came
    assert reply.startswith("HTTP/1.1 413"), reply[:200]
    assert f"of {size} bytes" in reply and "--max-body-mb" in reply
    assert time.monotonic() - t0 < 5


def test_a_chunked_body_is_cut_off_at_the_limit_and_not_buffered(server: Serve) -> None:
    rss0 = _rss_bytes(server.proc.pid)
    chunk = b"a" * (256 << 10)
    sent, answered = 0, ""
    with _raw(
        server,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n",
    ) as s:
        s.sendall(b'%x\r\n{"model": "tiny", "prompt": "\r\n' % 29)
        try:  # 64 MiB offered; the server stops reading after about 1 MiB
            while sent < 64 << 20:
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            answered = _response(s)
        except (ConnectionResetError, TimeoutError):
            answered = ""
    assert answered.startswith("HTTP/1.1 413"), (sent, answered[:300])
    assert "exceeds the server's limit of 1048576 bytes" in answered
    grew = _rss_bytes(server.proc.pid) - rss0
    assert grew < 32 << 20, f"the controller grew {grew / 1e6:.0f} MB"
    assert server.http.get("/health").status_code == 200


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(
    server: Serve,
) -> None:
    text = "hello " * 150_000  # 900 KB: within the body limit, far beyond the context
    r = server.http.post("/v1/completions", json={"model": MODEL, "prompt": text})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert f"{len(text)} characters" in err["message"] and "shorten" in err["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    r = server.http.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    # A prompt that fits still serves, so the bound refuses nothing a model can take.
    r = server.http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_the_body_limit_is_validated_once(tmp_path: Path) -> None:
    from tests.cli.test_cli import assert_one_line_error
    from tests.conftest import run_surge

    proc = run_surge(
        "serve", "--max-body-mb", "0", "--port", "0", "--state-dir", str(tmp_path / "s"),
        env={**os.environ, "SURGE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert_one_line_error(proc, "too small", "--max-body-mb")


def test_error_messages_stay_bounded_whatever_the_request_carries(
    server: Serve, tiny_hf: Path, tmp_path: Path
) -> None:
    huge = "m" * 1_000_000
    r = server.http.post("/v1/completions", json={"model": huge, "prompt": "x"})
    assert r.status_code == 404 and len(r.text) < 1000, r.text[:300]
    assert "1000000 characters" in r.json()["error"]["message"]
    r = server.http.get("/v1/nothing/" + "p" * 10_000)
    assert r.status_code == 404 and len(r.text) < 1000, r.text[:300]
    long_path = "/" + "a" * 100_000
    r = server.http.post("/v1/deployments", json={"name": "x", "model": long_path})
    assert r.status_code == 400 and len(r.text) < 1000, r.text[:300]
    # A checkpoint whose weights are truncated: a 400 that says so, not a 500.
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(tiny_hf, hf)
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    r = server.http.post("/v1/deployments", json={"name": "trunc", "model": str(hf)})
    assert r.status_code == 400, r.text[:300]
    assert "not a readable safetensors file" in r.json()["error"]["message"]
