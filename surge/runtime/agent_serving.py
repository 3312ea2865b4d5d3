"""What an agent runs: pipeline stages and full local instances (serve while loading).

Pipeline stages (λScale §4.3): `stage_open` makes a runner over a layer range from the
node's gpu-tier blocks (views, no copies) with the KV cache of exactly those layers;
`stage_step` runs one micro-batch — token ids at the head stage, hidden states elsewhere —
and hands the result to the next stage over the agents' own connections; the last stage
returns float32 logits, which travel back along the chain to whoever sent the step (the
pipeline's head engine, which samples). `stage_free` drops finished sequences along the
whole chain. Several micro-batches may be in the chain at once (2D pipelining): each stage
computes one at a time, in a worker thread, so the agent keeps serving the network.

Local instances (λScale §4.4 mode switch target): `instance_open` wraps the node's full
runner in an `LLMEngine`; `instance_submit` adds a request — optionally with tokens it
already generated elsewhere, whose KV cache is rebuilt by prefill; generated tokens go out as
`token` events. `instance_abort` takes requests back out (to move them elsewhere).
"""

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from surge.errors import SurgeError
from surge.runtime.transport import Connection

log = logging.getLogger(__name__)


@dataclass
class Stage:
    """One stage of a pipeline on this node."""

    pipeline: str
    model: str
    first_layer: int
    end_layer: int
    next_node: int | None
    runner: Any
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class LocalInstance:
    """A full copy of a model on this node, serving requests with continuous batching."""

    name: str
    model: str
    engine: Any
    requests: dict[int, str] = field(default_factory=dict)
    """seq_id -> the controller's request id."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    inbox: list[tuple[Any, asyncio.Future]] = field(default_factory=list)
    """Changes to the engine, applied by its loop between steps (never during one)."""

    async def call(self, fn: Any) -> Any:
        """Run `fn(engine)` between two steps and return its result."""
        fut = asyncio.get_running_loop().create_future()
        self.inbox.append((fn, fut))
        self.wake.set()
        return await fut


class ServingOps:
    """Mixin of `NodeAgent`: the ops that run models. Expects the agent's attributes."""

    stages: dict[str, Stage]
    instances: dict[str, LocalInstance]

    # ---- pipeline stages ---------------------------------------------------------

    def _stage_runner(self, model: str, first: int, end: int):
        from surge.engine.runner import ModelRunner

        state = self.model(model)  # type: ignore[attr-defined]
        manifest = state.manifest
        needed = set(manifest.blocks_for_layers(first, end))
        if first == 0:
            needed.add(0)
        if end == manifest.arch.num_layers:
            needed.add(manifest.num_blocks - 1)
        missing = sorted(b for b in needed if b not in state.gpu_buffers)
        if missing:
            raise SurgeError(
                f"node {self.node} lacks blocks {missing} for layers {first}-{end - 1}"
            )  # type: ignore[attr-defined]
        runner = ModelRunner(manifest, self.config.engine, layer_range=(first, end))  # type: ignore[attr-defined]
        for b in sorted(needed):
            runner.add_block(b, state.gpu_buffers[b], verify=False)
        return runner

    async def op_stage_open(self, conn: Connection, h: dict, p: memoryview) -> dict:
        first, end = int(h["first_layer"]), int(h["end_layer"])
        runner = await asyncio.to_thread(self._stage_runner, h["model"], first, end)
        nxt = h.get("next_node")
        self.stages[h["pipeline"]] = Stage(
            h["pipeline"], h["model"], first, end, None if nxt is None else int(nxt), runner
        )
        return {"pipeline": h["pipeline"]}

    async def op_stage_step(self, conn: Connection, h: dict, p: memoryview) -> None:
        import torch

        from surge.engine.batch import BatchMeta
        from surge.engine.hidden import hidden_from_bytes, hidden_to_bytes

        stage = self.stages.get(h["pipeline"])
        if stage is None:
            await conn.send({"ok": False, "error": f"no stage of pipeline {h['pipeline']} here"})
            return

        def compute() -> tuple[dict, Any]:
            if h["kind"] == "tokens":
                batch = BatchMeta.from_json(h["batch"])
                tokens = torch.frombuffer(bytearray(p), dtype=torch.int64).view(h["shape"])
                hidden = stage.runner.embed(tokens)
            else:
                hidden, batch, _ = hidden_from_bytes(p)
            hidden = stage.runner.run_layers(stage.first_layer, stage.end_layer, hidden, batch)
            if stage.next_node is None:
                logits = stage.runner.logits(hidden, batch).contiguous()
                return {"kind": "logits", "shape": list(logits.shape)}, logits.numpy()
            return {"kind": "hidden"}, hidden_to_bytes(hidden, batch)

        async with stage.lock:
            header, payload = await asyncio.to_thread(compute)
        if stage.next_node is not None:
            async with self._peer_conn(stage.next_node) as nxt:  # type: ignore[attr-defined]
                reply, body = await nxt.request(
                    {"op": "stage_step", "pipeline": stage.pipeline, **header}, payload
                )
            header, payload = {k: reply[k] for k in ("kind", "shape")}, body
        await conn.send({"ok": True, **header}, payload)

    async def op_stage_free(self, conn: Connection, h: dict, p: memoryview) -> dict:
        stage = self.stages.get(h["pipeline"])
        if stage is None:
            return {}
        for sid in h["seq_ids"]:
            stage.runner.free(int(sid))
        if stage.next_node is not None:
            async with self._peer_conn(stage.next_node) as nxt:  # type: ignore[attr-defined]
                await nxt.request(
                    {"op": "stage_free", "pipeline": stage.pipeline, "seq_ids": h["seq_ids"]}
                )
        return {}

    async def op_stage_close(self, conn: Connection, h: dict, p: memoryview) -> dict:
        self.stages.pop(h["pipeline"], None)
        return {}

    # ---- local instances ---------------------------------------------------------

    async def op_instance_open(self, conn: Connection, h: dict, p: memoryview) -> dict:
        from surge.engine.llm_engine import LLMEngine, LocalExecutor

        name, model = h["instance"], h["model"]
        state = self.model(model)  # type: ignore[attr-defined]
        if state.runner is None or len(state.gpu_buffers) < state.manifest.num_blocks:
            raise SurgeError(f"node {self.node} does not hold every block of {model} in gpu")  # type: ignore[attr-defined]
        if name not in self.instances:
            engine = LLMEngine(state.manifest, self.config.engine, LocalExecutor(state.runner))  # type: ignore[attr-defined]
            inst = LocalInstance(name, model, engine)
            inst.task = self._spawn(self._instance_loop(inst))  # type: ignore[attr-defined]
            self.instances[name] = inst
        return {"instance": name}

    async def op_instance_submit(self, conn: Connection, h: dict, p: memoryview) -> dict:
        from surge.engine.sampling import SamplingParams

        inst = self.instances[h["instance"]]
        params = SamplingParams(**h.get("params", {}))

        prompt = list(h["prompt_token_ids"])
        inst.engine.check_prompt(prompt)  # bad input is refused now, not at the next step
        params.validate()

        def add(engine: Any) -> int:
            sid = engine.add_request(prompt, params, list(h.get("output_token_ids", [])))
            inst.requests[sid] = h["req_id"]
            return sid

        # Answer at once; the loop adds the request at its next step boundary (waiting for
        # it here would hold the controller's router for a whole step per request).
        fut = asyncio.get_running_loop().create_future()
        inst.inbox.append((add, fut))
        inst.wake.set()
        return {"queued": True}

    async def op_instance_adopt(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Continue a request whose KV cache arrives with it (KV migration, ParaServe §6)."""
        import torch

        from surge.engine.sampling import SamplingParams

        inst = self.instances[h["instance"]]
        params = SamplingParams(**h.get("params", {}))
        dtype = inst.engine.executor.runner.dtype
        parts, offset = [], 0
        for part in h["parts"]:
            n = math.prod(part["shape"]) * dtype.itemsize
            kv = torch.frombuffer(bytearray(p[offset : offset + n]), dtype=dtype)
            parts.append((part["first_layer"], kv.view(part["shape"])))
            offset += n

        def adopt(engine: Any) -> int:
            sid = engine.adopt(
                list(h["prompt_token_ids"]),
                params,
                list(h["output_token_ids"]),
                int(h["num_cached"]),
            )
            for first_layer, kv in parts:
                engine.executor.runner.import_kv(sid, first_layer, kv)
            return sid

        sid = await inst.call(adopt)
        inst.requests[sid] = h["req_id"]
        return {"seq_id": sid}

    async def op_instance_abort(self, conn: Connection, h: dict, p: memoryview) -> dict:
        """Take requests out of a local instance; answers their tokens so far."""
        inst = self.instances[h["instance"]]
        wanted = set(h["req_ids"])

        def abort(engine: Any) -> dict:
            out = {}
            for sid, rid in list(inst.requests.items()):
                if rid in wanted:
                    out[rid] = engine.abort(sid).output_token_ids
                    del inst.requests[sid]
            return out

        return {"outputs": await inst.call(abort)}

    async def op_kv_export(self, conn: Connection, h: dict, p: memoryview) -> None:
        """K/V of one sequence's first `num_tokens` tokens at this stage (for migration)."""
        import torch

        stage = self.stages.get(h["pipeline"])
        if stage is None:
            await conn.send({"ok": False, "error": f"no stage of pipeline {h['pipeline']} here"})
            return
        async with stage.lock:  # never while a step writes this stage's cache
            kv = await asyncio.to_thread(
                stage.runner.export_kv, int(h["seq_id"]), int(h["num_tokens"])
            )
        await conn.send(
            {
                "ok": True,
                "first_layer": stage.first_layer,
                "end_layer": stage.end_layer,
                "shape": list(kv.shape),
            },
            kv.contiguous().view(-1).view(torch.uint8).numpy(),
        )

    async def op_instance_close(self, conn: Connection, h: dict, p: memoryview) -> dict:
        inst = self.instances.pop(h["instance"], None)
        if inst is not None and inst.task is not None:
            inst.task.cancel()
        return {}

    async def _instance_loop(self, inst: LocalInstance) -> None:
        while True:
            while inst.inbox:
                fn, fut = inst.inbox.pop(0)
                try:
                    fut.set_result(fn(inst.engine))
                except Exception as e:  # reported to the op that asked
                    fut.set_exception(e)
            if not inst.engine.has_unfinished:
                inst.wake.clear()
                if inst.inbox:
                    continue
                await inst.wake.wait()
                continue
            events = await asyncio.to_thread(inst.engine.step)
            for ev in events:
                rid = inst.requests.get(ev.seq_id)
                if rid is None:
                    continue
                if ev.finished:
                    del inst.requests[ev.seq_id]
                    inst.engine.seqs.pop(ev.seq_id, None)
                await self.emit(  # type: ignore[attr-defined]
                    {
                        "type": "token",
                        "instance": inst.name,
                        "req_id": rid,
                        "token": ev.token_id,
                        "finished": ev.finished,
                        "finish_reason": ev.finish_reason,
                    }
                )

    # ---- pooled connections for stage traffic -----------------------------------

    @contextlib.asynccontextmanager
    async def _peer_conn(self, node: int):
        """A connection to a peer for one exchange; several may be open at once, so
        micro-batches in flight do not queue behind each other's round trips."""
        free = self._stage_pool.setdefault(node, [])  # type: ignore[attr-defined]
        conn = free.pop() if free else None
        if conn is None or conn.closed:
            from surge.runtime.transport import connect

            host, port = self.peers[node]  # type: ignore[attr-defined]
            conn = await connect(
                host,
                port,
                self.config.token,
                f"node-{self.node}",  # type: ignore[attr-defined]
                self.egress,
                self.ingress,  # type: ignore[attr-defined]
            )
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        else:
            free.append(conn)
