"""Serving requests on whatever capacity exists right now: pipelines and local instances.

What flows: `ServeRequest`s come in (token ids + sampling settings); the `Server` routes
each to the endpoint with the least outstanding work — a `PipelineEndpoint` (an execution
pipeline across agents, whose head engine runs here) or a `LocalEndpoint` (a full instance
inside one agent) — or queues it until one exists. Tokens flow back onto the request.

Endpoints come and go during a scale-out (λScale §4.3-§4.4): `retire` takes an endpoint's
unfinished requests away (tokens so far included) and routes them again, so they continue
elsewhere by rebuilding their KV cache with one prefill over prompt + output. An endpoint
that fails (an agent died) is retired the same way: nothing is lost or duplicated, because
a request's tokens are only appended once a step has come back.
"""

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from surge.config import EngineConfig
from surge.engine.batch import BatchMeta
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.manifest import Manifest
from surge.runtime.client import ClusterClient

log = logging.getLogger(__name__)

SEQ_IDS_PER_GROUP = 1 << 40
"""Engines sharing a pipeline's KV caches use disjoint sequence-id ranges of this size."""


@dataclass
class ServeRequest:
    """One request and what has happened to it."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_t: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    first_token_t: float | None = None
    token_times: list[float] = field(default_factory=list)
    """When each token came back (monotonic clock)."""
    done_t: float | None = None
    finish_reason: str | None = None
    endpoint: str | None = None
    hops: list[str] = field(default_factory=list)
    """Every endpoint that served part of it, in order."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    on_done: Any = None
    """Called when the request finishes (the server dispatches queued work then)."""

    def add_token(self, token: int, finished: bool, reason: str | None) -> None:
        now = time.monotonic()
        if self.first_token_t is None:
            self.first_token_t = now
        self.output_token_ids.append(token)
        self.token_times.append(now)
        if finished:
            self.done_t = now
            self.finish_reason = reason
            self.done.set()
            if self.on_done is not None:
                self.on_done()

    @property
    def params_json(self) -> dict[str, Any]:
        p = self.params
        return {
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k,
            "seed": p.seed,
            "ignore_eos": p.ignore_eos,
            "stop_token_ids": list(p.stop_token_ids),
        }


class EndpointFailed(RuntimeError):
    """An endpoint can no longer serve (a member agent died)."""


class Endpoint:
    """Something that serves requests of one model."""

    name: str
    nodes: tuple[int, ...]
    requests: dict[str, ServeRequest]
    failed: bool = False
    capacity: int = 1 << 30
    """Most requests in flight here; the server keeps the rest queued, so capacity that
    opens later (a new pipeline) gets work too."""

    @property
    def outstanding(self) -> int:
        return len(self.requests)

    async def submit(self, req: ServeRequest) -> None:
        raise NotImplementedError

    async def take_back(self) -> list[ServeRequest]:
        """Stop serving; return the unfinished requests (their tokens are up to date)."""
        raise NotImplementedError


class LocalEndpoint(Endpoint):
    """A full instance inside one agent (`instance_open`); tokens arrive as events."""

    def __init__(
        self, client: ClusterClient, node: int, model: str, name: str, capacity: int = 64
    ) -> None:
        self.client, self.node, self.model, self.name = client, node, model, name
        self.nodes = (node,)
        self.requests = {}
        self.capacity = capacity

    async def open(self) -> None:
        await self.client.request(
            self.node, {"op": "instance_open", "instance": self.name, "model": self.model}
        )

    async def submit(self, req: ServeRequest) -> None:
        self.requests[req.req_id] = req
        await self.client.request(
            self.node,
            {
                "op": "instance_submit",
                "instance": self.name,
                "req_id": req.req_id,
                "prompt_token_ids": req.prompt_token_ids,
                "params": req.params_json,
                "output_token_ids": req.output_token_ids,
            },
        )

    def on_token(self, ev: dict[str, Any]) -> None:
        req = self.requests.get(ev["req_id"])
        if req is None:
            return
        req.add_token(ev["token"], ev["finished"], ev["finish_reason"])
        if ev["finished"]:
            del self.requests[req.req_id]

    async def take_back(self) -> list[ServeRequest]:
        reqs = list(self.requests.values())
        self.requests = {}
        if not self.failed and reqs:
            with contextlib.suppress(Exception):
                await self.client.request(
                    self.node,
                    {
                        "op": "instance_abort",
                        "instance": self.name,
                        "req_ids": [r.req_id for r in reqs],
                    },
                )
        return reqs


class RemotePipelineExecutor:
    """The `Executor` of a head engine whose layers run on a chain of agent stages.

    Called from the engine's worker thread; the network I/O runs on the event loop.
    """

    def __init__(
        self, client: ClusterClient, loop: asyncio.AbstractEventLoop, pipeline: str, head: int
    ) -> None:
        self.client, self.loop, self.pipeline, self.head = client, loop, pipeline, head

    def forward(self, token_ids: Any, batch: BatchMeta) -> Any:
        import torch

        header = {
            "op": "stage_step",
            "pipeline": self.pipeline,
            "kind": "tokens",
            "shape": list(token_ids.shape),
            "batch": batch.to_json(),
        }
        fut = asyncio.run_coroutine_threadsafe(
            self.client.exchange(self.head, header, token_ids.contiguous().numpy()), self.loop
        )
        try:
            reply, body = fut.result()
        except Exception as e:
            raise EndpointFailed(f"pipeline {self.pipeline}: {e}") from e
        return torch.frombuffer(bytearray(body), dtype=torch.float32).view(reply["shape"])

    def free(self, seq_ids: list[int]) -> None:
        fut = asyncio.run_coroutine_threadsafe(
            self.client.exchange(
                self.head, {"op": "stage_free", "pipeline": self.pipeline, "seq_ids": seq_ids}
            ),
            self.loop,
        )
        with contextlib.suppress(Exception):  # a dead stage has nothing left to free
            fut.result()


@dataclass
class _Group:
    """One micro-batch stream of a pipeline: its own head engine over the shared stages."""

    engine: LLMEngine
    pending: list[ServeRequest] = field(default_factory=list)
    seqs: dict[int, ServeRequest] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class PipelineEndpoint(Endpoint):
    """An execution pipeline: stages on agents, head engines (scheduler + sampler) here.

    `num_micro_batches` head engines run at once, each with its own share of the stages'
    KV caches, so that several micro-batches are in the chain together (λScale Fig. 6a).
    """

    def __init__(
        self,
        client: ClusterClient,
        manifest: Manifest,
        model: str,
        name: str,
        stages: list[tuple[int, int, int]],
        config: EngineConfig = EngineConfig(),
        num_micro_batches: int = 2,
    ) -> None:
        """`stages`: (node, first_layer, end_layer) in layer order."""
        self.client, self.manifest, self.model, self.name = client, manifest, model, name
        self.stages = stages
        self.nodes = tuple(s[0] for s in stages)
        self.requests = {}
        self.config = config
        self.num_micro_batches = num_micro_batches
        self.capacity = num_micro_batches * config.max_num_seqs
        self.groups: list[_Group] = []
        self.on_failure: Any = None
        """Called (as a task) with this endpoint when a step fails."""

    async def open(self) -> None:
        for i, (node, first, end) in enumerate(self.stages):
            nxt = self.stages[i + 1][0] if i + 1 < len(self.stages) else None
            await self.client.request(
                node,
                {
                    "op": "stage_open",
                    "pipeline": self.name,
                    "model": self.model,
                    "first_layer": first,
                    "end_layer": end,
                    "next_node": nxt,
                },
            )
        loop = asyncio.get_running_loop()
        group_cfg = EngineConfig(
            page_size_tokens=self.config.page_size_tokens,
            max_kv_tokens=max(
                self.config.page_size_tokens, self.config.max_kv_tokens // self.num_micro_batches
            ),
            max_num_seqs=self.config.max_num_seqs,
            max_prefill_tokens=self.config.max_prefill_tokens,
            device="cpu",
        )
        for g in range(self.num_micro_batches):
            executor = RemotePipelineExecutor(self.client, loop, self.name, self.stages[0][0])
            engine = LLMEngine(
                self.manifest, group_cfg, executor, first_seq_id=g * SEQ_IDS_PER_GROUP
            )
            group = _Group(engine)
            group.task = loop.create_task(self._run(group))
            self.groups.append(group)

    async def submit(self, req: ServeRequest) -> None:
        if self.failed:
            raise EndpointFailed(self.name)
        self.requests[req.req_id] = req
        group = min(self.groups, key=lambda g: len(g.seqs) + len(g.pending))
        group.pending.append(req)
        group.wake.set()

    async def _run(self, group: _Group) -> None:
        engine = group.engine
        while True:
            async with group.lock:
                for req in group.pending:
                    sid = engine.add_request(req.prompt_token_ids, req.params, req.output_token_ids)
                    group.seqs[sid] = req
                group.pending.clear()
                if not engine.has_unfinished:
                    group.wake.clear()
                else:
                    try:
                        events = await asyncio.to_thread(engine.step)
                    except EndpointFailed as e:
                        log.warning("%s failed: %s", self.name, e)
                        self.failed = True
                        if self.on_failure is not None:
                            asyncio.get_running_loop().create_task(self.on_failure(self))
                        return
                    for ev in events:
                        req = group.seqs.get(ev.seq_id)
                        if req is None:
                            continue
                        req.add_token(ev.token_id, ev.finished, ev.finish_reason)
                        if ev.finished:
                            del group.seqs[ev.seq_id]
                            engine.seqs.pop(ev.seq_id, None)
                            self.requests.pop(req.req_id, None)
                    continue
            await group.wake.wait()

    def detach(self) -> list[tuple[ServeRequest, int]]:
        """Stop the head engines now, keep the stages (and their KV caches) open, and return
        each unfinished request with its sequence id at the stages. A step in flight is
        abandoned: a request's KV length is what its tokens say (prompt + output - 1)."""
        out: list[tuple[ServeRequest, int]] = []
        for group in self.groups:
            if group.task is not None:
                group.task.cancel()
            out += [(req, sid) for sid, req in group.seqs.items()]
            out += [(req, -1) for req in group.pending]
            group.seqs.clear()
            group.pending.clear()
        self.requests = {}
        return out

    async def close_stages(self) -> None:
        for node, _, _ in self.stages:
            with contextlib.suppress(Exception):
                await self.client.request(node, {"op": "stage_close", "pipeline": self.name})

    async def take_back(self) -> list[ServeRequest]:
        """Stop every head engine now and hand back what is unfinished.

        A step still in flight is abandoned, not awaited: its tokens are never appended
        (the task is cancelled before it returns), so a moved request continues from
        exactly the tokens it has — none lost, none twice — and a mode switch does not wait
        for a slow step.
        """
        taken = [req for req, _ in self.detach()]
        if not self.failed:
            await self.close_stages()
        return taken


class Server:
    """Routes requests of one model over its live endpoints (least outstanding first)."""

    def __init__(self, client: ClusterClient, model: str) -> None:
        self.client, self.model = client, model
        self.endpoints: dict[str, Endpoint] = {}
        self.queue: list[ServeRequest] = []
        self.requests: dict[str, ServeRequest] = {}
        self._ids = itertools.count()
        self._events = client.listen()
        self._pump = asyncio.get_running_loop().create_task(self._pump_events())

    def new_request(self, prompt_token_ids: list[int], params: SamplingParams) -> ServeRequest:
        req = ServeRequest(f"r{next(self._ids)}", list(prompt_token_ids), params)
        self.requests[req.req_id] = req
        return req

    async def submit(self, req: ServeRequest) -> None:
        """Route a request now if some endpoint has room, else queue it (FIFO)."""
        req.on_done = self._kick
        self.queue.append(req)
        await self._dispatch()

    def _kick(self) -> None:
        asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        """Give queued requests to endpoints with room, least outstanding first."""
        while self.queue:
            live = [
                e for e in self.endpoints.values() if not e.failed and e.outstanding < e.capacity
            ]
            if not live:
                return
            req = self.queue.pop(0)
            ep = min(live, key=lambda e: (e.outstanding / e.capacity, e.name))
            req.endpoint = ep.name
            req.hops.append(ep.name)
            try:
                await ep.submit(req)
            except Exception as e:  # raced with a failure: route again
                log.info("submit to %s failed (%s); routing again", ep.name, e)
                ep.requests.pop(req.req_id, None)
                self.queue.insert(0, req)

    async def add_endpoint(self, ep: Endpoint) -> None:
        self.endpoints[ep.name] = ep
        if isinstance(ep, PipelineEndpoint):
            ep.on_failure = self._endpoint_failed
        await self._dispatch()

    async def retire(self, name: str) -> list[ServeRequest]:
        """Take an endpoint out; its unfinished requests continue elsewhere (mode switch)."""
        ep = self.endpoints.pop(name, None)
        if ep is None:
            return []
        moved = [r for r in await ep.take_back() if not r.done.is_set()]
        # Moved requests go first: they were admitted before anything still queued.
        self.queue[:0] = moved
        await self._dispatch()
        return moved

    async def _endpoint_failed(self, ep: Endpoint) -> None:
        log.warning("endpoint %s failed; re-running its requests elsewhere", ep.name)
        await self.retire(ep.name)

    async def _pump_events(self) -> None:
        while True:
            ev = await self._events.get()
            kind = ev.get("type")
            if kind == "token":
                for ep in self.endpoints.values():
                    if isinstance(ep, LocalEndpoint) and ep.name == ev.get("instance"):
                        ep.on_token(ev)
            elif kind == "agent_down":
                for ep in list(self.endpoints.values()):
                    if ev["node"] in ep.nodes:
                        ep.failed = True
                        await self.retire(ep.name)

    async def wait_all(self, timeout_s: float) -> None:
        await asyncio.wait_for(
            asyncio.gather(*(r.done.wait() for r in self.requests.values())), timeout_s
        )

    async def close(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        self.client.unlisten(self._events)
        for name in list(self.endpoints):
            ep = self.endpoints.pop(name)
            with contextlib.suppress(Exception):
                await ep.take_back()
