"""`/dashboard` in process: the page and its assets (no external URL anywhere), the SSE
body (the state first, then what the bus carries, unsubscribed when the page goes), and
the API key asked for as on /v1/* (header or `?key=`)."""

import asyncio
import json
import re
from unittest.mock import MagicMock

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from surge.api.app import create_app
from surge.api.dashboard import ASSETS, STATIC, stream
from surge.events import BlockLanded, EventBus, NodesKnown


def _client(api_key: str | None = None) -> TestClient:
    controller = MagicMock()
    controller.metrics.registry = CollectorRegistry()
    controller.events = EventBus()
    controller.timeline_now = lambda: [NodesKnown(nodes=(0, 1))]
    return TestClient(create_app(controller, api_key))


def test_page_and_assets_are_served_and_fetch_nothing_from_outside() -> None:
    c = _client()
    page = c.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name in re.findall(r"/dashboard/static/([\w.]+)", page.text):
        assert name in ASSETS
    assert set(re.findall(r"/dashboard/static/([\w.]+)", page.text)) == set(ASSETS)
    for name, kind in ASSETS.items():
        r = c.get(f"/dashboard/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == kind
    for f in STATIC.iterdir():
        assert not re.search(r"https?://", f.read_text()), f"{f.name} names an external URL"
    r = c.get("/dashboard/static/../app.py")
    assert r.status_code == 404
    r = c.get("/dashboard/static/secret.py")
    assert r.status_code == 404 and "no dashboard asset" in r.json()["error"]["message"]


def test_the_dashboard_is_not_in_the_openapi_schema() -> None:
    paths = _client().get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/dashboard")]


def test_api_key_is_asked_for_as_on_v1() -> None:
    c = _client(api_key="sekret")
    r = c.get("/dashboard")
    assert r.status_code == 401 and "?key=KEY" in r.json()["error"]["message"]
    assert c.get("/dashboard?key=wrong").status_code == 401
    assert c.get("/dashboard?key=sekret").status_code == 200
    assert c.get("/dashboard", headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert c.get("/dashboard/events").status_code == 401
    assert c.get("/dashboard/static/dashboard.js").status_code == 200  # no secrets in it
    assert c.get("/v1/models?key=sekret").status_code == 401  # ?key= is for the page only


def _frames(chunk: bytes) -> list[dict]:
    return [json.loads(x[6:]) for x in chunk.decode().split("\n") if x.startswith("data: ")]


def test_the_stream_sends_the_state_then_the_bus_and_unsubscribes() -> None:
    async def run() -> None:
        bus = EventBus()
        body = stream(bus, lambda: [NodesKnown(nodes=(0, 1, 2))])
        first = await anext(body)
        assert bus.active
        assert first.startswith(b"retry:") and _frames(first) == [
            {"type": "nodes", "t_s": 0.0, "nodes": [0, 1, 2]}
        ]
        for b in range(3):  # published together: sent together
            bus.publish(BlockLanded(model="m", node=1, block=b, tier="gpu"))
        frames = _frames(await anext(body))
        assert [f["block"] for f in frames] == [0, 1, 2] and all(f["t_s"] > 0 for f in frames)
        await body.aclose()  # the page went away
        assert not bus.active

    asyncio.run(run())
