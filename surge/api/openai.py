"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

What flows: raw body -> `protocol.parse` (a 400 naming the field for anything wrong or
unsupported) -> prompt token ids (tokenizer of the deployment, checked against the
vocabulary and context) -> one `TrackedRequest` per choice (`n` per prompt, seeds
seed+i) submitted to the controller -> a `RequestStream` per choice -> a JSON answer or
SSE chunks ending `data: [DONE]`. Every request handed to the controller is handed back
with `controller.finished` whatever happens. Owned by the API layer.
"""

import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from surge.api.chat import ChatTemplates
from surge.api.disconnect import CLIENT_GONE_STATUS, CancellableStream, unless_disconnected
from surge.api.error_map import error_body
from surge.api.intake import check_prompt_chars, encode_off_loop
from surge.api.logprobs import CompletionLogprobs, chat_logprobs
from surge.api.protocol import (
    DEFAULT_CHAT_TOKENS,
    DEFAULT_COMPLETION_TOKENS,
    MAX_CHOICES,
    ChatRequest,
    CompletionRequest,
    parse,
)
from surge.api.streaming import (
    SSE_DONE,
    SSE_KEEPALIVE,
    IncrementalDetokenizer,
    RequestStream,
    hand_back,
    merged,
    sse,
)
from surge.control.controller import Controller, Deployment
from surge.errors import InvalidInput, SurgeError

log = logging.getLogger(__name__)

KEEPALIVE_S = 5.0
"""A streamed request with nothing to send for this long gets an SSE comment, so proxies
and clients keep the connection while it is held (a scale-out from zero)."""


@dataclass
class Call:
    """One parsed generation request: its choices' prompts and settings."""

    dep: Deployment
    body: CompletionRequest | ChatRequest
    chat: bool
    prompts: list[list[int]]
    """Token ids of each prompt (completions may batch several)."""
    echo_texts: list[str] = field(default_factory=list)
    """Per prompt, the text `echo` puts before the answer ("" without echo)."""
    rid: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        obj = self.object + (".chunk" if chunk and self.chat else "")
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.dep.name,
            "choices": choices,
        }


def check_prompt_ids(dep: Deployment, ids: list[int], limit: int, param: str = "prompt") -> None:
    """A 400 with OpenAI's code for a prompt the model cannot take."""
    if not ids:
        raise InvalidInput("the prompt is empty; send at least one token", param=param)
    vocab = dep.manifest.arch.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidInput(
            f"token id {bad} is outside the vocabulary (0..{vocab - 1})",
            param=param,
            code="invalid_token",
        )
    if len(ids) >= limit:
        raise InvalidInput(
            f"the prompt has {len(ids)} tokens but the model's context holds {limit}; "
            f"shorten it to at most {limit - 1} tokens",
            param=param,
            code="context_length_exceeded",
        )


def openai_router(controller: Controller) -> APIRouter:
    router = APIRouter()
    templates = ChatTemplates(controller.registry)

    def deployment(name: str) -> Deployment:
        """The serving deployment (404 if none, 503 with the reason if it has failed)."""
        return controller.deployment(name)

    async def tokenize(dep: Deployment, text: str, limit: int, param: str) -> list[int]:
        """Bounded before it costs anything, then off the event loop (`api/intake.py`).
        A rendered chat template writes its own BOS: it is encoded without the tokenizer's
        (Hugging Face's and vLLM's `add_special_tokens=False`); a plain prompt with it."""
        if dep.tokenizer is None:
            raise InvalidInput(f"{dep.name} has no tokenizer; send the prompt as token ids")
        check_prompt_chars(dep.tokenizer, text, limit, param)
        return await encode_off_loop(dep.tokenizer, text, special=param != "messages")

    def model_card(dep: Deployment) -> dict[str, Any]:
        return {"id": dep.name, "object": "model", "created": 0, "owned_by": "surge"}

    @router.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(d) for d in controller.deployments.values()]}

    @router.get("/v1/models/{name}")
    async def get_model(name: str):
        return model_card(deployment(name))

    @router.post("/v1/completions")
    async def completions(request: Request):
        body = parse(CompletionRequest, await request.body())
        dep = deployment(body.model)
        limit = controller.context_limit(dep)
        prompts, echoes = [], []
        for p in body.prompts:
            ids = await tokenize(dep, p, limit, "prompt") if isinstance(p, str) else p
            check_prompt_ids(dep, ids, limit)
            prompts.append(ids)
            if body.echo:
                echoes.append(p if isinstance(p, str) else IncrementalDetokenizer(
                    dep.tokenizer).push(ids, final=True))  # fmt: skip
            else:
                echoes.append("")
        call = Call(dep, body, False, prompts, echoes, "cmpl-" + secrets.token_hex(12))
        return await respond(call, DEFAULT_COMPLETION_TOKENS, request)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = parse(ChatRequest, await request.body())
        dep = deployment(body.model)
        text = templates.get(dep.name, dep).render([m.for_template() for m in body.messages])
        limit = controller.context_limit(dep)
        ids = await tokenize(dep, text, limit, "messages")
        check_prompt_ids(dep, ids, limit, param="messages")
        call = Call(dep, body, True, [ids], [""], "chatcmpl-" + secrets.token_hex(12))
        return await respond(call, DEFAULT_CHAT_TOKENS, request)

    async def respond(call: Call, default_max: int, request: Request) -> Response:
        body, n = call.body, call.body.num_choices
        if n * len(call.prompts) > MAX_CHOICES:
            raise InvalidInput(
                f"n x prompts is {n * len(call.prompts)}; at most {MAX_CHOICES} per request",
                param="n",
            )
        limit = controller.context_limit(call.dep)
        jobs = [
            (ids, body.to_sampling_params(len(ids), limit, default_max, index=i * n + j))
            for i, ids in enumerate(call.prompts)
            for j in range(n)
        ]
        reqs: list[Any] = []
        try:
            for ids, params in jobs:
                reqs.append(await controller.submit(call.dep, ids, params))
        except BaseException:
            for r in reqs:
                controller.finished(r, "cancelled")
            raise
        streams = [RequestStream(r, call.dep.tokenizer, body.stops) for r in reqs]
        if body.stream:
            return CancellableStream(
                stream_events(call, streams, n),
                on_gone=lambda: client_gone(call, streams),
                media_type="text/event-stream",
                background=BackgroundTask(hand_back, streams, controller.finished),
            )
        answered, out = await unless_disconnected(whole_answer(call, streams, n), request.receive)
        if not answered:  # its requests were handed back "cancelled": aborted on the agents
            client_gone(call, streams)
            return Response(status_code=CLIENT_GONE_STATUS)
        assert out is not None
        return out

    def client_gone(call: Call, streams: list[RequestStream]) -> None:
        tokens = sum(len(s.req.output_token_ids) for s in streams)
        log.info("%s: the client went away after %d tokens; its requests are aborted",
                 call.rid, tokens)  # fmt: skip

    def logprob_builders(call: Call, streams: list[RequestStream], n: int) -> list[Any]:
        """Per choice, a function (start, end) -> its `logprobs` object (None: not asked)."""
        if call.body.wanted_logprobs() is None:
            return [None] * len(streams)
        tok = call.dep.tokenizer
        out: list[Any] = []
        for i, s in enumerate(streams):
            req = s.req
            if call.chat:
                out.append(
                    lambda a, b, r=req: chat_logprobs(tok, r.output_token_ids, r.logprobs, a, b)
                )
            else:
                build = CompletionLogprobs(tok, len(call.echo_texts[i // n]))
                out.append(lambda a, b, r=req, f=build: f(r.output_token_ids, r.logprobs, a, b))
        return out

    def usage(call: Call, streams: list[RequestStream], n: int) -> dict[str, int]:
        p = sum(len(ids) for ids in call.prompts)
        c = sum(len(s.req.output_token_ids) for s in streams)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    async def whole_answer(call: Call, streams: list[RequestStream], n: int) -> Response:
        texts = [[call.echo_texts[i // n]] for i in range(len(streams))]
        reasons = ["stop"] * len(streams)
        ends = [0] * len(streams)
        async for i, d in merged(streams, controller.finished):
            assert d is not None  # no keep-alive ticks asked
            texts[i].append(d.text)
            ends[i] = d.num_tokens
            if d.finish_reason:
                reasons[i] = d.finish_reason
        builders = logprob_builders(call, streams, n)
        choices = []
        for i, parts in enumerate(texts):
            text = "".join(parts)
            lp = builders[i](0, ends[i]) if builders[i] else None
            if call.chat:
                msg = {"role": "assistant", "content": text, "refusal": None}
                ch = {"index": i, "message": msg, "logprobs": lp, "finish_reason": reasons[i]}
            else:
                ch = {"index": i, "text": text, "logprobs": lp, "finish_reason": reasons[i]}
            choices.append(ch)
        out = call.envelope(choices, chunk=False)
        out["usage"] = usage(call, streams, n)
        return JSONResponse(out)

    async def stream_events(call: Call, streams: list[RequestStream], n: int) -> AsyncIterator[str]:
        include_usage = call.body.include_usage
        continuous = include_usage and call.body.continuous_usage

        def chunk(choices: list[dict[str, Any]]) -> str:
            body = call.envelope(choices, chunk=True)
            if include_usage:  # vLLM's continuous_usage_stats: the usage so far in each
                body["usage"] = usage(call, streams, n) if continuous else None
            return sse(body)

        builders = logprob_builders(call, streams, n)

        def choice(
            i: int, text: str, reason: str | None, first: bool, lp: Any = None
        ) -> dict[str, Any]:
            if not call.chat:
                return {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {}
            if text:
                delta["content"] = text
            return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason}

        if call.chat or any(call.echo_texts):
            for i in range(len(streams)):
                yield chunk([choice(i, call.echo_texts[i // n], None, call.chat)])
        # aclosing: a stream closed at a yield (its client gone) closes `merged` now, so its
        # requests are handed back at once, not when the generator is garbage-collected.
        try:
            async with contextlib.aclosing(
                merged(streams, controller.finished, KEEPALIVE_S)
            ) as deltas:
                async for i, d in deltas:
                    if d is None:  # held (e.g. for a scale-out from zero): keep the stream open
                        yield SSE_KEEPALIVE
                        continue
                    lp = builders[i](d.first_token, d.num_tokens) if builders[i] else None
                    yield chunk([choice(i, d.text, d.finish_reason, False, lp)])
        except SurgeError as e:  # the status is sent already: the error goes in the stream
            yield sse(error_body(e))
            yield SSE_DONE
            return
        if include_usage:
            last = call.envelope([], chunk=True)
            last["usage"] = usage(call, streams, n)
            yield sse(last)
        yield SSE_DONE

    return router
