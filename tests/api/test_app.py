"""`create_app` in process over a stand-in controller: surge's own /openapi.json describes
the generation bodies (so it can be fuzzed), errors map by type, each request is logged."""

import logging
from unittest.mock import MagicMock

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from surge.api.app import create_app


def _client() -> TestClient:
    controller = MagicMock()
    controller.metrics.registry = CollectorRegistry()
    controller.deployments = {}

    def missing(name: str) -> None:  # as `Controller.deployment` answers an unknown name
        from surge.errors import NotFound

        raise NotFound(f"the model {name!r} does not exist", param="model", code="model_not_found")

    controller.deployment.side_effect = missing
    return TestClient(create_app(controller))


def test_openapi_describes_the_request_bodies() -> None:
    spec = _client().get("/openapi.json").json()
    for path, name in (("/v1/completions", "CompletionRequest"),
                       ("/v1/chat/completions", "ChatRequest")):  # fmt: skip
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] == f"#/components/schemas/{name}"
        props = spec["components"]["schemas"][name]["properties"]
        assert {"model", "seed", "top_k", "n", "stop", "logprobs"} <= set(props)
    seed = spec["components"]["schemas"]["CompletionRequest"]["properties"]["seed"]
    assert seed["anyOf"][0]["maximum"] == 2**63 - 1


def test_errors_by_type_and_one_access_line(caplog) -> None:
    c = _client()
    with caplog.at_level(logging.INFO, logger="surge.access"):
        r = c.post("/v1/completions", json={"model": "ghost", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["param"] == "model"
    lines = [x.getMessage() for x in caplog.records if x.name == "surge.access"]
    assert len(lines) == 1 and '"POST /v1/completions" 404' in lines[0]
    r = c.get("/v1/nothing")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]


def _refusing_client(tok):
    """A stand-in controller whose every request ends refused (as a hold timeout does)."""
    import asyncio

    from surge.engine.sampling import SamplingParams
    from surge.errors import Unavailable

    class Refused:
        def __init__(self, params: SamplingParams) -> None:
            self.params, self.output_token_ids = params, []
            self.progress, self.done = asyncio.Event(), asyncio.Event()
            self.exception = Unavailable("held past hold_timeout_s", retry_after_s=2)
            self.finish_reason = "error"
            self.done.set()

    async def submit(dep, ids, params):
        return Refused(params)

    controller = MagicMock()
    controller.metrics.registry = CollectorRegistry()
    dep = MagicMock()
    dep.name, dep.tokenizer, dep.manifest.arch.vocab_size = "m", tok, 400
    controller.deployments = {"m": dep}
    controller.deployment.side_effect = lambda name: controller.deployments[name]
    controller.context_limit.return_value = 256
    controller.submit = submit
    return TestClient(create_app(controller)), controller


def test_a_refused_request_is_503_or_an_error_event_in_the_stream() -> None:
    from surge.model.tokenizer import build_tokenizer

    c, controller = _refusing_client(build_tokenizer(400))
    body = {"model": "m", "prompt": "hello", "max_tokens": 4}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert r.json()["error"]["code"] == "service_unavailable"
    r = c.post("/v1/completions", json={**body, "stream": True})
    assert r.status_code == 200  # the status went out before the refusal
    frames = [x for x in r.text.split("\n\n") if x]
    assert '"service_unavailable"' in frames[-2] and frames[-1] == "data: [DONE]"
    assert controller.finished.call_count == 2  # every request handed back


def test_a_client_gone_mid_body_is_one_access_line_not_an_internal_error(caplog) -> None:
    """A client that closed its connection halfway through its body was logged as an
    ERROR 'internal error' with a traceback (starlette's ClientDisconnect) and counted 500."""
    import asyncio

    app = _client().app
    messages = [{"type": "http.request", "body": b'{"model":', "more_body": True}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5555),
    }  # fmt: skip
    with caplog.at_level(logging.INFO):
        asyncio.run(app(scope, receive, send))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    lines = [x.getMessage() for x in caplog.records if x.name == "surge.access"]
    assert len(lines) == 1 and '"POST /v1/completions" 499' in lines[0], lines
    assert not sent  # nothing answered into a closed connection
