"""`surge deploy`, `surge status`, `surge delete`: thin clients of a running `surge serve`."""

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from surge.cli.serve_config import SERVE_STRATEGIES
from surge.errors import SurgeError

UrlOpt = Annotated[
    str | None, typer.Option(help="Server URL (default $SURGE_URL or http://127.0.0.1:8000).")
]
KeyOpt = Annotated[str | None, typer.Option(help="API key (default $SURGE_API_KEY).")]


TIMEOUT_S = 600.0
"""How long a thin client waits for an answer (a deployment of a large checkpoint imports it
on the server before it answers)."""


def _call(method: str, path: str, url: str | None, api_key: str | None, body: Any = None) -> Any:
    import httpx

    base = (url or os.environ.get("SURGE_URL") or "http://127.0.0.1:8000").rstrip("/")
    key = api_key or os.environ.get("SURGE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.request(method, base + path, json=body, headers=headers, timeout=TIMEOUT_S)
    except httpx.ReadTimeout:  # it was reached: "cannot reach ... is it running?" misled
        raise SurgeError(
            f"surge at {base} did not answer {method} {path} within {TIMEOUT_S:g} s; it may "
            "still be at work on it: see `surge status`"
        ) from None
    except httpx.HTTPError as e:
        raise SurgeError(f"cannot reach surge at {base} ({e}); is `surge serve` running?") from None
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):  # another service answered (an HTML page, a bare value)
        raise SurgeError(
            f"{base} answered {method} {path} with HTTP {r.status_code} but not as surge does "
            "(no JSON object); is --url (or $SURGE_URL) a running `surge serve`?"
        )
    if r.status_code >= 400:
        err = data.get("error")
        msg = err.get("message") if isinstance(err, dict) else None
        raise SurgeError(f"{msg or r.reason_phrase} (HTTP {r.status_code})")
    return data


def deploy(
    name: Annotated[str, typer.Argument(help="Deployment (served model) name.")],
    model: Annotated[str, typer.Option(help="Store or Hugging Face checkpoint directory.")],
    strategy: Annotated[
        str,
        typer.Option(help=f"A system surge serve runs: {', '.join(SERVE_STRATEGIES)}."),
    ] = "lambdascale",
    min_replicas: Annotated[int | None, typer.Option(help="0 = scale to zero.")] = None,
    max_replicas: Annotated[int | None, typer.Option(help="Default: every slot.")] = None,
    target_ongoing_requests: Annotated[float | None, typer.Option(help="Per instance.")] = None,
    upscale_delay_s: Annotated[float | None, typer.Option()] = None,
    downscale_delay_s: Annotated[float | None, typer.Option()] = None,
    keep_alive_s: Annotated[float | None, typer.Option(help="Idle time before zero.")] = None,
    max_queued_requests: Annotated[
        int, typer.Option(help="Requests held while no instance has room; past it: 429.")
    ] = 256,
    hold_timeout_s: Annotated[
        float, typer.Option(help="Longest wait for an instance; past it: 503.")
    ] = 60.0,
    ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO.")] = None,
    tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO.")] = None,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Deploy a model on a running `surge serve`."""
    numbers = {
        "--target-ongoing-requests": target_ongoing_requests,
        "--upscale-delay-s": upscale_delay_s,
        "--downscale-delay-s": downscale_delay_s,
        "--keep-alive-s": keep_alive_s,
        "--hold-timeout-s": hold_timeout_s,
        "--ttft-ms": ttft_ms,
        "--tpot-ms": tpot_ms,
    }
    for flag, v in numbers.items():  # JSON has no NaN or infinity: a ValueError traceback
        if v is not None and not math.isfinite(v):
            raise SurgeError(f"{flag} must be a finite number (got {v})")
    path = Path(model).expanduser()
    body = {
        "name": name,
        "model": str(path.resolve()) if path.exists() else model,
        "strategy": strategy,
        # Only the knobs given: the others are the strategy's system's (`SystemConfig.autoscale`).
        "autoscaling": {
            k: v
            for k, v in (
                ("min_replicas", min_replicas),
                ("max_replicas", max_replicas),
                ("target_ongoing_requests", target_ongoing_requests),
                ("upscale_delay_s", upscale_delay_s),
                ("downscale_delay_s", downscale_delay_s),
                ("keep_alive_s", keep_alive_s),
            )
            if v is not None
        },
        "slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms},
        "admission": {"max_queued_requests": max_queued_requests, "hold_timeout_s": hold_timeout_s},
    }
    out = _call("POST", "/v1/deployments", url, api_key, body)
    typer.echo(f"deployed {out['name']} ({out['strategy']}, {out['status']['num_blocks']} blocks)")


def status(
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Show deployments and nodes of a running `surge serve`."""
    deps = _call("GET", "/v1/deployments", url, api_key)["data"]
    nodes = _call("GET", "/v1/nodes", url, api_key)["data"]
    if as_json:
        typer.echo(json.dumps({"deployments": deps, "nodes": nodes}, indent=2))
        return
    typer.echo(
        f"{'deployment':<20} {'strategy':<16} {'inst':>4} {'load':>4} {'queue':>5} {'ongoing':>7}"
    )
    for d in deps:
        s = d["status"]
        typer.echo(
            f"{d['name']:<20} {d['strategy']:<16} {s['instances']:>4} {s['loading']:>4} "
            f"{s['queued']:>5} {s['ongoing']:>7}"
        )
        fp = s.get("flexpipe")
        if fp:
            stages = [len(p["stages"]) for p in fp["pipelines"]]
            refactors = " ".join(f"{k}={v}" for k, v in sorted(fp["refactors"].items()))
            typer.echo(f"  flexpipe: cv {fp['cv']} stages {stages} refactors {refactors}")
        if s.get("state") == "failed":
            typer.echo(f"  failed: {s.get('failure')} (surge delete {d['name']}, then deploy)")
    up = sum(n["up"] for n in nodes)
    typer.echo(f"nodes: {up}/{len(nodes)} up")


def delete(
    name: Annotated[str, typer.Argument(help="Deployment to delete.")],
    url: UrlOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Delete a deployment (its instances and cached copies go too)."""
    from surge.control.spec import NAME_RE

    # Checked here, since the name is a piece of the URL: 'm?x=1' deleted deployment m.
    if not NAME_RE.fullmatch(name):
        raise SurgeError(
            f"no deployment can be named {name!r} (names are 1-64 letters, digits, '.', '_' "
            "or '-'); see `surge status` for the names"
        )
    _call("DELETE", f"/v1/deployments/{name}", url, api_key)
    typer.echo(f"deleted {name}")
