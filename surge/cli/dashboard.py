"""`surge dashboard FILE.json`: the dashboard page replaying a recorded timeline.

What flows: a timeline file (`surge simulate --timeline`, the page's "save timeline", a
benchmark's; format in `surge/events.py`) is read and checked once, then served with the
page on 127.0.0.1 (by default): `/dashboard?replay=/dashboard/timeline.json` plays it, the
same page `surge serve` shows live. One JSON line on stdout says where; Ctrl-C stops it.
"""

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Annotated

import typer

TIMELINE_PATH = "/dashboard/timeline.json"


def dashboard(
    timeline: Annotated[Path, typer.Argument(help="A timeline JSON file to replay.")],
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free).")] = 8100,
) -> None:
    """Replay a recorded timeline (`surge simulate --timeline`) in the dashboard page."""
    from surge.events import Timeline

    tl = Timeline.read(timeline)  # a bad file is one error line, before anything listens
    from surge.cli.listener import bind_listener, check_port

    check_port(port)
    sock = bind_listener(host, port)
    try:
        asyncio.run(_serve(json.dumps(tl.to_json()).encode(), sock, len(tl.events)))
    finally:
        sock.close()


async def _serve(body: bytes, sock, num_events: int) -> None:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import RedirectResponse, Response

    from surge.api.dashboard import dashboard_router
    from surge.events import EventBus

    app = FastAPI(title="surge dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(dashboard_router(EventBus(), list))
    replay_url = f"/dashboard?replay={TIMELINE_PATH}"

    @app.get(TIMELINE_PATH)
    async def timeline_file():
        return Response(body, media_type="application/json")

    @app.get("/")
    async def root():
        return RedirectResponse(replay_url)

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    task = loop.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        h, p = sock.getsockname()[:2]
        url = f"http://{h}:{p}{replay_url}"
        print(json.dumps({"ready": True, "url": url, "port": p, "events": num_events}), flush=True)
    await task
