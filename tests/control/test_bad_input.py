"""Bad input gets a 4xx JSON error with a message, never a 500 or a traceback."""

from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import run_surge
from tests.control.test_serve_openai import MODEL, server  # noqa: F401 (module fixture)


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
        ("/v1/chat/completions", {"model": "nope", "messages": []}, 404, ["nope"]),
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
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, ["n=1"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, ["stream"]),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": 3}, 400, ["stop"]),
        ("/v1/completions", {"model": MODEL, "prompt": [0, 99999]}, 400, ["vocabulary"]),
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
    ],
)
def test_bad_requests_get_4xx_json(server, path, body, status, words) -> None:  # noqa: F811
    check_error(server.http.post(path, json=body), status, *words)


def test_malformed_json_unknown_routes_and_deployments(server) -> None:  # noqa: F811
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


def test_openai_client_sees_typed_errors(server) -> None:  # noqa: F811
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
        ("dep.yaml", "deployments:\n  - {name: x, model: /m, strategy: magic}\n", "strategy"),
        ("strategy.yaml", "strategy: magic\n", "unknown strategy 'magic'"),
        ("sim.yaml", "strategy: faasnet\n", "only in the simulator"),
        ("list.yaml", "- 1\n- 2\n", "mapping"),
        ("bad.ini", "x=1\n", ".yaml, .yml or .toml"),
    ],
)
def test_bad_config_file_is_one_line_exit_2(tmp_path: Path, name, text, words) -> None:
    cfg = tmp_path / name
    cfg.write_text(text)
    r = run_surge("serve", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
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
