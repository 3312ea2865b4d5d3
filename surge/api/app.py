"""The HTTP front door: `create_app` wires auth, errors, the access log and the routes.

- OpenAI routes (`api/openai.py`): `GET /v1/models[/{id}]`, `POST /v1/completions`,
  `POST /v1/chat/completions`; request and response fields in `api/protocol.py`.
- Admin routes (`api/admin.py`): `/v1/deployments[/{name}]`, `/v1/nodes`, `/health`,
  `/metrics` (Prometheus text format).
- The live dashboard (`api/dashboard.py`): `/dashboard`, its assets, its event stream.

Every error is JSON `{"error": {"message", "type", "param", "code"}}`, its status chosen
by the exception's *type* (`surge/errors.py`), never its message. A bug is a 500 with
the same shape, logged once, and the connection stays usable. Each request leaves one
INFO access-log line and counts in `surge_http_responses_total{status}`.
"""

import contextlib
import logging
import time
import weakref
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from surge.api.admin import admin_router
from surge.api.auth import ApiKeyAuth
from surge.api.dashboard import dashboard_router
from surge.api.disconnect import CLIENT_GONE_STATUS
from surge.api.error_map import body, classify
from surge.api.intake import BodyLimit, IntakeLimits
from surge.api.openai import openai_router
from surge.api.protocol import ChatRequest, CompletionRequest
from surge.control.controller import Controller
from surge.errors import SurgeError, shorten

log = logging.getLogger(__name__)
access_log = logging.getLogger("surge.access")


def error_response(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    return JSONResponse(body(message, kind, param, code), status_code=status)


_COUNTERS: "weakref.WeakKeyDictionary[CollectorRegistry, Counter]" = weakref.WeakKeyDictionary()


def responses_counter(registry: CollectorRegistry) -> Counter:
    """`surge_http_responses_total{status}` in the controller's registry (once per registry,
    however many apps are made over one controller)."""
    if registry not in _COUNTERS:
        _COUNTERS[registry] = Counter(
            "surge_http_responses",
            "HTTP responses by status code (4xx/5xx are errors)",
            ["status"],
            registry=registry,
        )
    return _COUNTERS[registry]


class AccessLog:
    """ASGI middleware: one INFO line per request, its status counted, and a bug that
    escapes everything else answered as a JSON 500 (nothing re-raised, so the server
    keeps the keep-alive connection instead of resetting it)."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 0

        async def send_wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapped)
        except ClientDisconnect:  # the client left while its body was read: nobody to answer
            status = status or CLIENT_GONE_STATUS  # (was an ERROR, a traceback and a 500)
        except Exception as e:
            log.exception("internal error on %s", scope.get("path"))
            if status == 0:
                status = 500
                r = error_response(500, f"internal error: {type(e).__name__}", "server_error")
                await r(scope, receive, send)
        finally:
            self.counter.labels(str(status)).inc()
            client = scope.get("client") or ("-", 0)
            access_log.info(
                '%s:%s "%s %s" %d %.1fms',
                client[0],
                client[1],
                scope.get("method"),
                scope.get("path"),
                status,
                (time.perf_counter() - t0) * 1000,
            )


def openapi_with_bodies(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the request bodies of the generation routes (they parse their
    raw body with `protocol.parse`, so FastAPI cannot see the models itself)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for path, model in BODIES.items():
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(body.pop("$defs", {}))
            comps[model.__name__] = body
            ref = {"$ref": f"#/components/schemas/{model.__name__}"}
            schema["paths"][path]["post"]["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": ref}},
            }
        app.openapi_schema = schema
    return app.openapi_schema


BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}


def create_app(
    controller: Controller,
    api_key: str | None = None,
    manage: bool = False,
    limits: IntakeLimits | None = None,
) -> FastAPI:
    """The app over `controller`; with `manage`, the app's lifespan starts and stops it.
    `limits` bound what one request may carry (`api/intake.py`)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage:
            await controller.start()
        try:
            yield
        finally:
            if manage:
                await controller.stop()

    app = FastAPI(title="surge", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.controller = controller

    @app.exception_handler(SurgeError)
    async def _surge_error(request: Request, e: SurgeError):
        status, content, headers = classify(e)
        return JSONResponse(content, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        err: dict[str, Any] = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in err.get("loc", ()))
        return error_response(400, f"{where}: {err.get('msg', e)}", "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            msg = f"no route {request.method} {shorten(request.url.path)}"
        else:
            msg = str(e.detail)
        return error_response(e.status_code, msg, "invalid_request_error")

    app.include_router(openai_router(controller))
    app.include_router(admin_router(controller))
    app.include_router(dashboard_router(controller.events, controller.timeline_now))
    app.openapi = lambda: openapi_with_bodies(app)  # type: ignore[method-assign]
    if api_key:
        app.add_middleware(ApiKeyAuth, api_key=api_key)
    limits = limits or IntakeLimits()
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)  # inside the access log
    app.add_middleware(AccessLog, counter=responses_counter(controller.metrics.registry))
    return app
