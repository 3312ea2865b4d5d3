"""What an agent does for FlexPipe's inflight refactoring and profiling (paper 003 §5, §6).

What flows: the controller (`runtime/migration/refactor.py`) re-cuts a live pipeline between two
steps. A node that keeps some layers opens its new stage next to the old one and copies
the K/V of the layers both share inside the node (`stage_kv_copy`: no transport); K/V of
layers that change node goes agent to agent: the old stage's node exports it and sends each
new holder its layers (`kv_push` -> the peer's `kv_import`, bytes in the payload, valid
tokens only: Eq. 10), so it never passes through the controller. `stage_profile` times
each layer of a stage on this node (a prefill of `num_tokens` tokens and a one-token
decode step, with a scratch sequence that is freed at once) and reports the hidden-state
bytes per token: the t_c and s_a of §5's partition DP. Handlers are composed into
`AgentServing` (they share its stages).
"""

import asyncio
import math
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from surge.emulation import StepPacer
from surge.errors import SurgeError
from surge.policy.versions import refuse_kv
from surge.runtime.node.context import Handlers
from surge.runtime.node.instances import kv_parts
from surge.runtime.node.stage import Stage
from surge.runtime.protocol import (
    Ack,
    KvImportOp,
    KvPart,
    KvPushOp,
    KvPushReply,
    KvTarget,
    LayerTimesReply,
    StageKvCopyOp,
    StageProfileOp,
)
from surge.runtime.transport import Connection

PROFILE_SEQ_ID = (1 << 62) + 7
"""Scratch sequence id of a profiling run (outside every head engine's id range)."""


def _same_version(old: Stage, new: Stage, node: int, where: str) -> None:
    """Refuses K/V from stage `old` into stage `new` (both on `node`) if their weights are of
    two versions (`policy.versions.refuse_kv`)."""
    why = refuse_kv(new.model, node, new.runner.manifest.digest, old.runner.manifest.digest)
    if why is not None:
        raise SurgeError(f"{where}: {why}")


def refactor_handlers(
    stage_of: Any,
    node: int,
    peer_conn: Callable[[int], AbstractAsyncContextManager[Connection]],
    pacer: StepPacer | None = None,
) -> Handlers:
    """The ops below, over `stage_of(pipeline) -> Stage` (raises for an unknown one), on
    agent `node`, reaching other agents through `peer_conn(node)`. Under GPU-time emulation
    (`pacer`) a stage profile reports the emulated GPU's layer times (what its paced steps
    last, in emulated seconds), not the host's."""

    async def op_kv_push(op: KvPushOp, conn: Connection, p: memoryview) -> KvPushReply:
        import torch

        stage: Stage = stage_of(op.pipeline)
        for t in op.targets:
            if not stage.first_layer <= t.first_layer < t.end_layer <= stage.end_layer:
                raise SurgeError(
                    f"kv_push: layers [{t.first_layer}, {t.end_layer}) are outside stage "
                    f"{op.pipeline} [{stage.first_layer}, {stage.end_layer}) on node {node}"
                )
        async with stage.lock:  # never while a step writes this stage's cache
            kv = await asyncio.to_thread(
                stage.runner.export_kv, op.seq_id, op.num_tokens, op.first_token
            )

        digest = stage.runner.manifest.digest  # each new holder refuses another version's

        async def push(t: KvTarget) -> int:
            part = kv[t.first_layer - stage.first_layer : t.end_layer - stage.first_layer]
            if t.node == node:  # the new stage is on this node too: write it in place
                new: Stage = stage_of(op.new_pipeline)
                _same_version(stage, new, node, "kv_push")
                async with new.lock:
                    new.runner.import_kv(op.seq_id, t.first_layer, part, op.first_token)
                return 0
            part = part.contiguous()
            shape = tuple(part.shape)
            imp = KvImportOp(
                pipeline=op.new_pipeline,
                seq_id=op.seq_id,
                parts=(KvPart(t.first_layer, t.end_layer, shape, digest),),
                first_token=op.first_token,
            )
            body = part.view(-1).view(torch.uint8).numpy()
            async with peer_conn(t.node) as c:
                await c.request(imp.to_json(), body)
            return len(body)

        sent = await asyncio.gather(*(push(t) for t in op.targets))
        return KvPushReply(num_bytes=sum(sent))

    async def op_kv_import(op: KvImportOp, conn: Connection, p: memoryview) -> Ack:
        stage: Stage = stage_of(op.pipeline)
        parts = kv_parts(op.parts, p, stage.runner, "kv_import", (stage.model, node))
        async with stage.lock:
            for first_layer, kv in parts:
                stage.runner.import_kv(op.seq_id, first_layer, kv, op.first_token)
        return Ack()

    async def op_stage_kv_copy(op: StageKvCopyOp, conn: Connection, p: memoryview) -> Ack:
        new: Stage = stage_of(op.pipeline)
        old: Stage = stage_of(op.source)
        lo = max(new.first_layer, old.first_layer)
        hi = min(new.end_layer, old.end_layer)
        if lo >= hi:
            return Ack()
        _same_version(old, new, node, "stage_kv_copy")

        firsts = op.first_tokens or (0,) * len(op.seqs)

        def copy() -> None:
            for (seq_id, num_tokens), first in zip(op.seqs, firsts, strict=True):
                kv = old.runner.export_kv(seq_id, num_tokens, first)
                part = kv[lo - old.first_layer : hi - old.first_layer]
                new.runner.import_kv(seq_id, lo, part, first)

        async with old.lock, new.lock:
            await asyncio.to_thread(copy)
        return Ack()

    async def op_stage_profile(
        op: StageProfileOp, conn: Connection, p: memoryview
    ) -> LayerTimesReply:
        import torch

        from surge.engine.batch import BatchMeta

        stage: Stage = stage_of(op.pipeline)
        runner = stage.runner
        hidden_size = runner.arch.hidden_size

        def layer_times(x: Any, batch: BatchMeta) -> list[float]:
            out = []
            for layer in range(stage.first_layer, stage.end_layer):
                best = math.inf
                for _ in range(op.repeats):
                    t0 = time.perf_counter()
                    runner.run_layers(layer, layer + 1, x, batch)
                    best = min(best, time.perf_counter() - t0)
                out.append(best)
            return out

        def emulated() -> tuple[list[float], list[float]]:
            assert pacer is not None
            n = runner.arch.num_layers
            layers = range(stage.first_layer, stage.end_layer)
            prefill = [pacer.emulated_s((op.num_tokens,), i, i + 1, n) for i in layers]
            return prefill, [pacer.emulated_s((1,), i, i + 1, n) for i in layers]

        def run() -> tuple[list[float], list[float]]:
            if pacer is not None:
                return emulated()
            q = op.num_tokens
            try:
                x = torch.randn(1, q, hidden_size) * 0.02
                prefill = layer_times(x, BatchMeta((PROFILE_SEQ_ID,), (0,), (q,)))
                y = torch.randn(1, 1, hidden_size) * 0.02
                decode = layer_times(y, BatchMeta((PROFILE_SEQ_ID,), (q,), (1,)))
            finally:
                runner.free(PROFILE_SEQ_ID)
            return prefill, decode

        async with stage.lock:
            prefill, decode = await asyncio.to_thread(run)
        return LayerTimesReply(
            first_layer=stage.first_layer,
            prefill_s=tuple(prefill),
            decode_s=tuple(decode),
            activation_bytes_per_token=hidden_size * runner.dtype.itemsize,
        )

    return {
        KvPushOp: op_kv_push,
        KvImportOp: op_kv_import,
        StageKvCopyOp: op_stage_kv_copy,
        StageProfileOp: op_stage_profile,
    }
