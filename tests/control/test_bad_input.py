"""Bad input gets a 4xx JSON error with a message, never a 500 or a traceback."""

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import run_surge
from tests.control.conftest import Serve, start_serve
from tests.control.test_serve_openai import MODEL

# One xdist worker runs every test of this module: the module's `surge serve` then starts once,
# not once on each worker that draws one of its tests.
pytestmark = pytest.mark.xdist_group("bad_input")


@pytest.fixture(scope="module")
def server(tmp_path_factory, surge_home: Path, tiny_store_dir: Path) -> Iterator[Serve]:
    """One agent: every check here is of the API in front of the cluster (the 4-node server
    of test_serve_openai started 3 more agents, each importing torch, for nothing)."""
    config = {"nodes": 1, "deployments": [{"name": MODEL, "model": str(tiny_store_dir)}]}
    s = start_serve(tmp_path_factory.mktemp("bad-input"), surge_home, config)
    yield s
    s.stop()


def check_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    msg = body["error"]["message"]
    assert msg and body["error"]["type"], body
    assert "Traceback" not in r.text
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, ["nope"]),
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            404,
            ["nope"],
        ),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, ["messages"]),
        ("/v1/completions", {"prompt": "x"}, 400, ["model"]),
        ("/v1/completions", {"model": MODEL}, 400, ["prompt"]),
        ("/v1/chat/completions", {"model": MODEL}, 400, ["messages"]),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, ["messages"]),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "x"}]}, 400, ["role"]),
        ("/v1/completions", {"model": 5, "prompt": "x"}, 400, ["model"]),
        ("/v1/completions", {"model": MODEL, "prompt": 5}, 400, ["prompt"]),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "max_tokens": "9"},
            400,
            ["max_tokens"],
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, ["max_tokens"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -3}, 400, ["max_tokens"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 10**9}, 400, ["context"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, []),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 9}, 400, []),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, ["top_p"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 99}, 400, ["n"]),
        # defect 1: a seed outside int64 is a 400, not a hang
        ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": 2**64}, 400, ["seed"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": -(2**63) - 1}, 400, ["seed"]),
        # defect 7: top_k below -1, unsupported fields named, never ignored
        ("/v1/completions", {"model": MODEL, "prompt": "x", "top_k": -5}, 400, ["top_k"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "suffix": "!"}, 400, ["suffix"]),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "logit_bias": {"5": 1}},
            400,
            ["logit_bias"],
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "colour": 1}, 400, ["colour"]),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            400,
            ["tools"],
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"},
            400,
            ["tool_choice"],
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_object"},
            },
            400,
            ["response_format"],
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, ["stream"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": 3}, 400, ["stop"]),
        ("/v1/completions", {"model": MODEL, "prompt": [0, 99999]}, 400, ["vocabulary"]),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, ["empty"]),
        ("/v1/completions", {"model": MODEL, "prompt": []}, 400, ["empty"]),
        ("/v1/completions", {"model": MODEL, "prompt": [1] * 5000}, 400, ["context"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * 40000}, 400, ["context"]),
        ("/v1/deployments", {"name": MODEL, "model": "/x"}, 409, ["already exists"]),
        ("/v1/deployments", {"name": "d", "model": "/no/such/dir"}, 400, ["neither"]),
        ("/v1/deployments", {"name": "bad name!", "model": "/x"}, 400, ["name"]),
        ("/v1/deployments", {"name": "d", "model": "/x", "strategy": "magic"}, 400, ["strategy"]),
        ("/v1/deployments", {"name": "d", "model": "/x", "colour": 1}, 400, ["colour"]),
        (
            "/v1/deployments",
            {"name": "d", "model": "/x", "autoscaling": {"min_replicas": 3, "max_replicas": 2}},
            400,
            ["max_replicas"],
        ),
        (
            "/v1/deployments",
            {"name": "d", "model": "/x", "autoscaling": {"keep_alive_s": "long"}},
            400,
            ["keep_alive_s"],
        ),
        ("/v1/deployments", {"model": "/x"}, 400, ["name"]),
        (  # compiled at once, not on the first chat request (then a 400 on every chat)
            "/v1/deployments",
            {"name": "d", "model": "/x", "chat_template": "{% if %}"},
            400,
            ["chat_template does not compile"],
        ),
        (
            "/v1/deployments",
            {"name": "d", "model": "/x", "strategy": "flexpipe", "flexpipe": {"cv_window_s": 0}},
            400,
            ["cv_window_s must be > 0"],
        ),
        (
            "/v1/deployments",
            {"name": "d", "model": "/x", "flexpipe": {"decision_interval_s": 0.05}},
            400,
            ["strategy 'flexpipe' only"],
        ),
    ],
)
def test_bad_requests_get_4xx_json(server, path, body, status, words) -> None:
    check_error(server.http.post(path, json=body), status, *words)


@pytest.mark.parametrize(
    ("prompt", "code"),
    [("", None), ([0, 99999], "invalid_token"), ([1] * 5000, "context_length_exceeded")],
)
def test_prompt_errors_carry_the_right_code(server, prompt, code) -> None:  # defect 7
    r = server.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    check_error(r, 400)
    assert r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["param"] == "prompt"


def _exchange(sock: socket.socket, path: str, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 keep-alive request on `sock`; (status, body) of its answer."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = sock.recv(65536)
        assert got, "the server closed the keep-alive connection"
        buf += got
    header, rest = buf.split(b"\r\n\r\n", 1)
    length = int(next(h for h in header.split(b"\r\n") if h.lower().startswith(b"content-length"))
                 .split(b":")[1])  # fmt: skip
    while len(rest) < length:
        got = sock.recv(65536)
        assert got, "the server closed the connection mid-answer"
        rest += got
    return int(header.split(b" ")[1]), rest


def test_hostile_bodies_are_400_and_the_connection_lives_on(server) -> None:  # defect 4
    surrogate = b'{"model": "surge-tiny", "prompt": "a\\ud800b", "max_tokens": 2}'
    deep = b'{"model": "surge-tiny", "prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    deep_chat = b'{"model": "surge-tiny", "messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    good = b'{"model": "surge-tiny", "prompt": "hi", "max_tokens": 2}'
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        for path, raw in [
            ("/v1/completions", surrogate),
            ("/v1/completions", deep),
            ("/v1/chat/completions", deep_chat),
            ("/v1/deployments", deep),
            ("/v1/deployments", b'{"name": "d", "model": "/x\\ud800"}'),
        ]:
            status, body = _exchange(sock, path, raw)
            assert status == 400 and b"JSON" in body and b"Traceback" not in body, body
            status, body = _exchange(sock, "/v1/completions", good)  # the same connection
            assert status == 200, body


def test_errors_are_counted_by_status(server) -> None:
    def count(status: str) -> float:
        text = server.http.get("/metrics").text
        key = f'surge_http_responses_total{{status="{status}"}}'
        return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(key))

    before = count("404"), count("400")
    server.http.get("/v1/models/ghost")
    server.http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "top_k": -5})
    assert count("404") == before[0] + 1 and count("400") == before[1] + 1


def test_generate_seed_out_of_range_is_one_line_exit_2() -> None:  # defect 1
    r = run_surge("generate", "--prompt", "hi", "--temperature", "1", "--seed", str(2**64))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error:") and "seed" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_malformed_json_unknown_routes_and_deployments(server) -> None:
    h = {"content-type": "application/json"}
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/deployments"):
        check_error(server.http.post(path, content=b"{not json", headers=h), 400, "JSON")
        check_error(server.http.post(path, content=b"[1, 2]", headers=h), 400, "object")
    check_error(server.http.get("/v1/deployments/ghost"), 404, "ghost")
    check_error(server.http.delete("/v1/deployments/ghost"), 404, "ghost")
    check_error(server.http.get("/v1/models/ghost"), 404, "ghost")
    check_error(server.http.get("/v1/nothing-here"), 404)
    check_error(server.http.put("/v1/completions", json={}), 405)
    assert server.http.get("/health").json()["status"] == "ok"


def test_openai_client_sees_typed_errors(server) -> None:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="ghost", prompt="hi")
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=0)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("bad.yaml", "nodes: [1, 2\n", "not valid"),
        ("bad.toml", "nodes = = 3\n", "not valid"),
        ("typo.yaml", "nodez: 3\n", "unknown setting 'nodez'"),
        ("type.yaml", "nodes: four\n", "nodes must be a int"),
        ("fuse.yaml", "fuse_projections: 1\n", "fuse_projections must be a bool"),
        ("dep.yaml", "deployments:\n  - {name: x, model: /m, strategy: magic}\n", "strategy"),
        ("strategy.yaml", "strategy: magic\n", "unknown strategy 'magic'"),
        (
            "flex.yaml",
            "deployments:\n  - {name: x, model: /m, strategy: flexpipe, "
            "flexpipe: {decision_interval_s: -1}}\n",
            "decision_interval_s must be > 0",
        ),
        ("sim.yaml", "strategy: faasnet\n", "only in the simulator"),
        ("log.yaml", "log_level: verbose\n", "log_level must be one of debug, info"),
        (
            "template.yaml",
            "deployments:\n  - {name: x, model: /m, chat_template: '{{ messages'}\n",
            "deployment: chat_template does not compile",
        ),
        ("list.yaml", "- 1\n- 2\n", "mapping"),
        ("groups.yaml", "nodes: 2\nhost_groups: [[0, 0]]\n", "host_groups must be disjoint"),
        ("caps.yaml", "nodes: 2\negress_gbps: [1]\n", "one cap > 0 per node"),
        ("bad.ini", "x=1\n", ".yaml, .yml or .toml"),
    ],
)
def test_bad_config_file_is_one_line_exit_2(tmp_path: Path, name, text, words) -> None:
    cfg = tmp_path / name
    cfg.write_text(text)
    # --port 0: 8000 may be another test's (a good config file would bind it).
    r = run_surge("serve", "--config", str(cfg), "--state-dir", str(tmp_path / "s"), "--port", "0")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_surge("serve", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [("magic", "choose one of lambdascale, blitzscale, paraserve"), ("nccl", "simulator")],
)
def test_bad_strategy_flag_is_one_line_exit_2(tmp_path: Path, value, words) -> None:
    """Checked before any agent starts: `surge serve` runs the served `policy.systems`."""
    r = run_surge("serve", "--strategy", value, "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_thin_client_without_a_server_is_one_line(tmp_path: Path) -> None:
    r = run_surge("status", "--url", "http://127.0.0.1:9")
    assert r.returncode == 2 and "cannot reach surge" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("nodes: 2\nhost_groups: [[0, 5]]\n", "host_groups must be disjoint"),
        ("nodes: 2\nhost_groups: [[zero]]\n", "host_groups must be lists of node ids"),
        ("nodes: 2\ningress_gbps: [1, 0]\n", "one cap > 0 per node"),
        ("nodes: 2\negress_gbps: [1, x]\n", "egress_gbps must be a list of numbers"),
    ],
)
def test_bad_settings_are_refused_before_the_port_binds(tmp_path: Path, text, words) -> None:
    """A port someone else holds: settings checked first answer with their own error, not
    'cannot listen'; nothing was made (the state directory) and nothing started."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(text)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run_surge("serve", "--config", str(cfg), "--state-dir", str(tmp_path / "s"),
                      "--port", str(port))  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
