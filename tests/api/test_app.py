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
