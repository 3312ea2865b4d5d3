"""API-key authentication of the HTTP API: `Authorization: Bearer KEY` on `/v1/*` and on the
dashboard's pages (which may pass `?key=KEY`, as a browser's page and EventSource send no
header). A request without the key is answered 401 and goes no further. Owned by the API
layer; `create_app` mounts it when `surge serve --api-key` is given.

Plain ASGI, not Starlette's `BaseHTTPMiddleware`: that one runs the app in a task group of
its own and wraps `receive`, so a client that went away surfaced as exceptions and
tracebacks instead of the `http.disconnect` the routes watch for (issue 36).
"""

import secrets

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from surge.api.error_map import body


class ApiKeyAuth:
    """ASGI middleware: a 401 for a protected path without the right key."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.api_key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        path = conn.url.path
        page = path.startswith("/dashboard") and not path.startswith("/dashboard/static/")
        if path.startswith("/v1/") or page:
            header = conn.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if page and not token:
                token = conn.query_params.get("key", "")
            if not secrets.compare_digest(token.encode(), self.api_key):
                message = "missing or wrong API key (Authorization: Bearer KEY" + (
                    ", or ?key=KEY)" if page else ")"
                )
                content = body(message, "authentication_error", code="invalid_api_key")
                await JSONResponse(content, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
