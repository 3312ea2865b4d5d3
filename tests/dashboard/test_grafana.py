"""`deploy/grafana/surge.json` is a Grafana dashboard whose every query names a series
that `/metrics` exposes (read from the app's own `/metrics`), and it covers what the
issue lists: requests, TTFT/ITL, queue, instances, scale-outs by start kind, bytes moved,
GPU-seconds."""

import json
import re
from unittest.mock import AsyncMock, MagicMock

from fastapi.testclient import TestClient

from surge.api.app import create_app
from surge.control.metrics import Metrics
from surge.events import EventBus
from tests.conftest import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "surge.json"
NAME = re.compile(r"\b(?:surge_[a-z_]+|vllm:[a-z_:]+)")


def _queried() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return {n for e in exprs for n in NAME.findall(e)}


def _exposed() -> dict[str, str]:
    """Series name -> type, as a Prometheus server scrapes them from `/metrics`: a counter
    `X` is `X_total`, a histogram `X` is `X_bucket`, `X_sum` and `X_count`."""
    controller = MagicMock()
    controller.metrics = Metrics()
    controller.events = EventBus()
    controller.refresh_metrics = AsyncMock()  # the agents' counters: none here
    text = TestClient(create_app(controller)).get("/metrics").text
    series = {}
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        if kind == "counter":  # the text format names the family with or without _total
            series[family.removesuffix("_total") + "_total"] = kind
        elif kind == "histogram":
            series.update({family + s: kind for s in ("_bucket", "_sum", "_count")})
        else:
            series[family] = kind
    return series


def test_every_queried_metric_is_exposed() -> None:
    queried, exposed = _queried(), _exposed()
    assert len(queried) >= 10
    missing = sorted(queried - set(exposed))
    assert not missing, f"the Grafana dashboard queries series /metrics lacks: {missing}"


def test_the_dashboard_covers_the_issue_list_and_is_grafana_shaped() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"] == "surge"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        assert all(t["refId"] and t["expr"] for t in p["targets"])
    queried = _queried()
    for want in (
        "surge_requests_total",
        "surge_ttft_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "surge_queue_length",
        "surge_instances",
        "surge_scale_outs_total",
        "surge_bytes_moved_total",
        "surge_gpu_seconds_total",
    ):
        assert want in queried, want
