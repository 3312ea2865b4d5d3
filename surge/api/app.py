"""The HTTP front door: OpenAI-compatible endpoints, admin endpoints, health and metrics.

- `GET /v1/models`, `GET /v1/models/{id}`
- `POST /v1/completions`, `POST /v1/chat/completions` (stream true: SSE ending
  `data: [DONE]`; max_tokens, temperature, top_p, seed, stop, n=1, usage; vLLM's
  `ignore_eos` and `top_k` as extensions)
- `POST /v1/deployments`, `GET /v1/deployments[/{name}]`, `DELETE /v1/deployments/{name}`,
  `GET /v1/nodes`
- `GET /health`, `GET /metrics` (Prometheus text format)

Every error is JSON `{"error": {"message", "type", "param", "code"}}` with a 4xx status
for anything the caller can fix; a bug is a 500 with the same shape and no traceback.
"""

import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from surge.api.chat import check_messages, load_chat_template, render
from surge.control.controller import Controller, Deployment, TrackedRequest
from surge.engine.llm_engine import check_prompt
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default `max_tokens` for /v1/completions."""
DEFAULT_CHAT_TOKENS = 256
"""Default for chat when neither max_tokens nor max_completion_tokens is given."""
MAX_STOP = 4


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", **kw):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code = kw.get("param"), kw.get("code")


def error_response(status: int, message: str, kind: str, param=None, code=None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


# ---- request parsing ---------------------------------------------------------------


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _num(body: dict, key: str, default: float | None, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ApiError(400, f"{key} must be a number", param=key)
    if not lo <= v <= hi:
        raise ApiError(400, f"{key} must be between {lo} and {hi} (got {v})", param=key)
    return float(v)


def _int(body: dict, key: str, default: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{key} must be an integer", param=key)
    return v


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{key} must be true or false", param=key)
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOP:
        raise ApiError(400, f"stop takes at most {MAX_STOP} sequences", param="stop")
    return stops


class Call:
    """One parsed generation request."""

    def __init__(self, dep: Deployment, prompt_ids: list[int], params: SamplingParams, body):
        self.dep, self.prompt_ids, self.params = dep, prompt_ids, params
        self.stop = _stop(body)
        self.stream = _bool(body, "stream")
        opts = body.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        self.include_usage = bool((opts or {}).get("include_usage", False))
        self.created = int(time.time())


# ---- the app -----------------------------------------------------------------------


def create_app(controller: Controller, api_key: str | None = None, manage: bool = False) -> FastAPI:
    """The app over `controller`; with `manage`, the app's lifespan starts and stops it."""

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

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return error_response(e.status, e.message, e.kind, e.param, e.code)

    @app.exception_handler(SurgeError)
    async def _surge_error(request: Request, e: SurgeError):
        return error_response(400, str(e), "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        return error_response(400, str(e.errors()[:1]), "invalid_request_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(e.status_code, str(e.detail), kind)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error: {type(e).__name__}", "internal_error")

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), api_key.encode()):
                return error_response(
                    401,
                    "missing or wrong API key (Authorization: Bearer KEY)",
                    "authentication_error",
                )
        return await call_next(request)

    def deployment(name: Any) -> Deployment:
        if not isinstance(name, str):
            raise ApiError(400, "model must be a string", param="model")
        dep = controller.deployments.get(name)
        if dep is None:
            raise ApiError(
                404,
                f"the model {name!r} does not exist; GET /v1/models lists the deployed ones",
                code="model_not_found",
                param="model",
            )
        return dep

    def sampling(body: dict, dep: Deployment, prompt_ids: list[int], default_max: int):
        if _int(body, "n", 1) != 1:
            raise ApiError(400, "only n=1 is supported", param="n")
        if _int(body, "best_of", 1) != 1:
            raise ApiError(400, "only best_of=1 is supported", param="best_of")
        if body.get("logprobs") not in (None, False, 0):
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        if _bool(body, "echo"):
            raise ApiError(400, "echo is not supported", param="echo")
        try:
            check_prompt(dep.manifest.arch, controller.engine, prompt_ids)
        except SurgeError as e:
            raise ApiError(400, str(e), param="prompt", code="context_length_exceeded") from None
        limit = controller.context_limit(dep)
        room = limit - len(prompt_ids)
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else None
        max_tokens = _int(body, key or "max_tokens")
        if max_tokens is None:
            max_tokens = min(default_max, room)
        if max_tokens < 1:
            raise ApiError(400, f"max_tokens must be >= 1 (got {max_tokens})", param="max_tokens")
        if max_tokens > room:
            raise ApiError(
                400,
                f"max_tokens {max_tokens} + the prompt's {len(prompt_ids)} tokens exceed the "
                f"model's context of {limit} tokens; ask for at most {room}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        for k in ("presence_penalty", "frequency_penalty"):
            _num(body, k, 0.0, -2.0, 2.0)  # accepted, not applied
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=_num(body, "temperature", 1.0, 0.0, 2.0) or 0.0,
            top_p=_num(body, "top_p", 1.0, 1e-9, 1.0) or 1.0,
            top_k=max(0, _int(body, "top_k", 0) or 0),
            seed=_int(body, "seed"),
            ignore_eos=_bool(body, "ignore_eos"),
        )

    def tokenize(dep: Deployment, text: str) -> list[int]:
        if dep.tokenizer is None:
            raise ApiError(400, f"{dep.name} has no tokenizer; send the prompt as token ids")
        return dep.tokenizer.encode(text).ids

    def detok(dep: Deployment, ids: list[int]) -> str:
        if dep.tokenizer is None:
            return "".join(f" {t}" for t in ids)
        return dep.tokenizer.decode(ids)

    async def generate(call: Call) -> AsyncIterator[tuple[str, str | None, TrackedRequest]]:
        """Yields (new text, finish_reason or None, request) as tokens come back."""
        req = await controller.submit(call.dep, call.prompt_ids, call.params)
        sent = 0
        hold = max((len(s) for s in call.stop), default=1) - 1
        status = "ok"
        try:
            while True:
                await req.progress.wait()
                req.progress.clear()
                done = req.done.is_set()
                text = detok(call.dep, req.output_token_ids)
                reason = req.finish_reason if done else None
                cut = min((i for s in call.stop if (i := text.find(s)) >= 0), default=-1)
                if cut >= 0:
                    text, done, reason = text[:cut], True, "stop"
                    req.finish("stop_string")
                # Hold back a partial multi-byte character or a possible stop prefix.
                end = len(text) if done else max(sent, len(text) - hold)
                if not done and text[sent:end].endswith("\ufffd"):
                    end = sent
                if end > sent or done:
                    yield text[sent:end], (reason or "stop") if done else None, req
                    sent = end
                if done:
                    if req.finish_reason == "abort":
                        status = "aborted"
                    return
        except BaseException:
            status = "cancelled"
            raise
        finally:
            controller.finished(req, status)

    def usage(call: Call, req: TrackedRequest) -> dict[str, int]:
        p, c = len(call.prompt_ids), len(req.output_token_ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    async def respond(call: Call, chat: bool) -> Response:
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str, reason: str | None, first: bool) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
            if text and not first:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

        def chunk(choices: list, usage_: dict | None = None) -> str:
            body = {
                "id": rid,
                "object": obj + (".chunk" if chat else ""),
                "created": call.created,
                "model": call.dep.name,
                "choices": choices,
            }
            if call.include_usage:
                body["usage"] = usage_
            return f"data: {json.dumps(body)}\n\n"

        if call.stream:

            async def events() -> AsyncIterator[str]:
                first = True
                req = None
                async for text, reason, r in generate(call):
                    req = r
                    if text or first:
                        yield chunk([choice(text, None, first)])
                        first = False
                    if reason is not None:
                        yield chunk([choice("", reason, False)])
                if call.include_usage and req is not None:
                    yield chunk([], usage(call, req))
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        parts, reason, req = [], "stop", None
        async for text, r, got in generate(call):
            req = got
            parts.append(text)
            reason = r or reason
        assert req is not None
        text = "".join(parts)
        if chat:
            ch = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
        else:
            ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": call.created,
                "model": call.dep.name,
                "choices": [ch],
                "usage": usage(call, req),
            }
        )

    # ---- OpenAI endpoints ----------------------------------------------------------

    def model_card(dep: Deployment) -> dict[str, Any]:
        return {"id": dep.name, "object": "model", "created": 0, "owned_by": "surge"}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(d) for d in controller.deployments.values()]}

    @app.get("/v1/models/{name}")
    async def get_model(name: str):
        return model_card(deployment(name))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await json_body(request)
        if "model" not in body:
            raise ApiError(400, "model is required", param="model")
        dep = deployment(body["model"])
        if "prompt" not in body:
            raise ApiError(400, "prompt is required", param="prompt")
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            ids = tokenize(dep, prompt)
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            ids = list(prompt)
        else:
            raise ApiError(
                400,
                "prompt must be a string or a list of token ids (one prompt per request)",
                param="prompt",
            )
        params = sampling(body, dep, ids, DEFAULT_COMPLETION_TOKENS)
        return await respond(Call(dep, ids, params, body), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await json_body(request)
        if "model" not in body:
            raise ApiError(400, "model is required", param="model")
        dep = deployment(body["model"])
        if "messages" not in body:
            raise ApiError(400, "messages is required", param="messages")
        messages = check_messages(body["messages"])
        root = controller.registry / dep.name
        text = render(messages, load_chat_template(root))
        ids = tokenize(dep, text)
        params = sampling(body, dep, ids, DEFAULT_CHAT_TOKENS)
        return await respond(Call(dep, ids, params, body), chat=True)

    # ---- admin -------------------------------------------------------------------

    @app.get("/v1/deployments")
    async def list_deployments():
        return {"data": [controller.describe(d) for d in controller.deployments.values()]}

    @app.post("/v1/deployments", status_code=201)
    async def create_deployment(request: Request):
        body = await json_body(request)
        if isinstance(body.get("name"), str) and body["name"] in controller.deployments:
            raise ApiError(409, f"deployment {body['name']!r} already exists", code="conflict")
        try:
            dep = await controller.create(body)
        except SurgeError as e:
            status = 409 if "already exists" in str(e) else 400
            raise ApiError(status, str(e)) from None
        return JSONResponse(controller.describe(dep), status_code=201)

    @app.get("/v1/deployments/{name}")
    async def get_deployment(name: str):
        dep = controller.deployments.get(name)
        if dep is None:
            raise ApiError(404, f"no deployment {name!r}", "not_found_error")
        return controller.describe(dep)

    @app.delete("/v1/deployments/{name}")
    async def delete_deployment(name: str):
        try:
            await controller.delete(name)
        except KeyError:
            raise ApiError(404, f"no deployment {name!r}", "not_found_error") from None
        return {"deleted": name}

    @app.get("/v1/nodes")
    async def nodes():
        return {"data": controller.nodes_view(), "parameter_pool": controller.pool.view()}

    # ---- health and metrics --------------------------------------------------------

    @app.get("/health")
    async def health():
        live = controller.live_nodes()
        return {"status": "ok" if live else "degraded", "nodes_up": len(live)}

    @app.get("/metrics")
    async def metrics():
        return Response(controller.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
