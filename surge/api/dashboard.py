"""The live dashboard: `GET /dashboard` (the page), its assets, and its event stream.

What flows: `GET /dashboard/events` is one server-sent-events stream per open page. It
starts with the controller's state now (`Controller.timeline_now`), then carries every
`TimelineEvent` the controller, the autoscaler and the scale-outs publish on
`Controller.events` (`surge/events.py`) as `data: {"type": ..., "t_s": ..., ...}` lines,
several events per write when they come fast. The page (`api/static/`) draws them; with
`?replay=URL` it fetches a recorded timeline (`surge simulate --timeline`, the page's own
"save timeline", a benchmark's) and plays that instead. Nothing is fetched from outside:
the page is plain JS and SVG, shipped in the package.

Auth: with an API key set, `/dashboard*` asks for it as `/v1/*` does (`api/app.py`); an
EventSource cannot send headers, so `?key=` is accepted there too. Owned by the API layer.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from surge.errors import NotFound
from surge.events import EventBus, TimelineEvent

STATIC = resources.files("surge.api") / "static"
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard_view.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
"""The page's files, by name, and their content types (nothing else is served)."""
KEEPALIVE_S = 15.0
"""An SSE comment this often, so proxies keep an idle stream open."""
MAX_BATCH = 256
"""Events sent in one write at most."""


def sse(events: list[TimelineEvent]) -> bytes:
    """Server-sent-event lines for `events` (one `data:` line each)."""
    lines = (f"data: {json.dumps(e.to_json(), separators=(',', ':'))}\n\n" for e in events)
    return "".join(lines).encode()


async def stream(bus: EventBus, now: Callable[[], list[TimelineEvent]]) -> AsyncIterator[bytes]:
    """The SSE body: the state `now()`, then what the bus carries; unsubscribes when the
    page goes (the subscription is taken before the state, so nothing between is lost, and
    inside the body, so a page gone before it starts leaves none behind)."""
    sub = bus.subscribe()
    try:
        yield b"retry: 1000\n\n" + sse(now())
        while True:
            try:
                async with asyncio.timeout(KEEPALIVE_S):
                    ev = await sub.queue.get()
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            batch = [ev]
            while len(batch) < MAX_BATCH and not sub.queue.empty():
                batch.append(sub.queue.get_nowait())
            yield sse(batch)
    finally:
        bus.unsubscribe(sub)


def page_html() -> str:
    return (STATIC / "dashboard.html").read_text()


def dashboard_router(bus: EventBus, now: Callable[[], list[TimelineEvent]]) -> APIRouter:
    """The page, its assets and the stream over `bus` (`now`: the state a new page starts
    from; empty for a replay-only server)."""
    router = APIRouter()

    @router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(page_html(), headers={"Cache-Control": "no-store"})

    @router.get("/dashboard/static/{name}", include_in_schema=False)
    async def asset(name: str):
        if name not in ASSETS:
            raise NotFound(f"no dashboard asset {name!r}; there are {', '.join(ASSETS)}")
        return Response((STATIC / name).read_bytes(), media_type=ASSETS[name])

    @router.get("/dashboard/events", include_in_schema=False)
    async def events():
        body = stream(bus, now)
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    return router
