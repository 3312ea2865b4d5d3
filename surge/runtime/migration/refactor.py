"""FlexPipe's live pipelines: stages re-cut between two steps, requests running (paper 003 §6).

What flows: a `FlexPipeline` is a `PipelineEndpoint` (stages on agents, head engines here)
whose head engines step through a `StepGate`. `refactor_pipeline` turns its stages into new
ones (split: coarse -> fine, merge: fine -> coarse):
1. the nodes of the new stages load the blocks they lack (`load`, the caller's: from their
   own tier) while the pipeline keeps serving;
2. a snapshot between two steps (the gate closed for a moment) lists every running
   sequence's valid tokens; the new stages open under a new stage key next to the old
   ones and, while the old stages keep serving (FlexPipe §6.3: asynchronous transfer),
   that K/V follows its layers: layers that stay on a node are copied inside it
   (`stage_kv_copy`); layers that change node travel over the transport as
   `system.refactor` (Eq. 10) lists them, valid tokens only, agent to agent (`kv_push` to
   the old stage's node, which sends `kv_import` to each new holder);
3. the gate closes between two engine steps (none in flight, none starts) and only the
   top-up moves: the tokens generated since the snapshot, and whole sequences that
   started meanwhile (`policy.flexpipe.refactor.kv_top_ups`); sequences that finished
   meanwhile are freed on the new stages;
4. the head engines' executors point at the new first stage, the head keeps the number
   of micro-batches the caller asks for (η for η stages, §7 Eq. 12; engines are added,
   or stop taking requests and drain), the old stages close, the gate opens. The
   engines' sequences (ids, tokens, positions) never change, so each request continues
   token-exact, without recomputation.
Any failure before step 4 closes the new stages and leaves the old ones serving (the
refactoring did not happen); the caller gives back the slots it had booked.
Owned by the runtime; the decision (stage count, layers, nodes) is the controller's,
from `surge.policy.flexpipe.system`.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from surge.model.manifest import Manifest
from surge.policy.flexpipe.refactor import RefactorPlan, kv_top_ups
from surge.policy.flexpipe.system import refactor
from surge.policy.pipeline_adoption import stage_blocks
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.endpoints import EndpointFailed
from surge.runtime.migration.failures import failure_level
from surge.runtime.pipeline_endpoint import PipelineEndpoint
from surge.runtime.protocol import (
    KvPushOp,
    KvTarget,
    StageCloseOp,
    StageFreeOp,
    StageKvCopyOp,
    StageOpenOp,
)

log = logging.getLogger(__name__)

Stages = list[tuple[int, int, int]]
"""(node, first_layer, end_layer) per stage, in layer order."""


class StepGate:
    """Engine steps share it; a refactoring holds it alone, between two steps."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._in_flight = 0
        self._paused = False

    @contextlib.asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._paused)
            self._in_flight += 1
        try:
            yield
        finally:
            async with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._paused)
            self._paused = True
            await self._cond.wait_for(lambda: self._in_flight == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._paused = False
                self._cond.notify_all()


def stage_key(name: str, version: int) -> str:
    """The name a FlexPipe pipeline's stages are opened under on the agents after `version`
    refactorings (`parse_stage_key` reads it back)."""
    return name if version == 0 else f"{name}@{version}"


def parse_stage_key(key: str) -> tuple[str, int]:
    """(pipeline name, refactorings) of a stage key `stage_key` wrote."""
    name, at, version = key.rpartition("@")
    return (name, int(version)) if at else (key, 0)


class FlexPipeline(PipelineEndpoint):
    """An execution pipeline whose stages can be re-cut while it serves."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.version = 0
        """How many refactorings it went through (the stage key's suffix)."""
        self.gate = StepGate()
        self.step_gate = self.gate.step  # each head-engine step inside the gate
        self.merge_gate = self.gate.exclusive  # a merge's late hand-overs: alone
        self.refactoring = False
        """A refactoring is under way (the controller starts no second one)."""
        self.layer_times: dict[int, tuple[float, float]] = {}
        """Layer -> (prefill s, decode s) as profiled on its node (`stage_profile`)."""
        self.activation_bytes_per_token = 0
        """Hidden-state bytes per token between stages (profiled)."""

    @property
    def stage_key(self) -> str:
        """The name its current stages are opened under on the agents."""
        return stage_key(self.name, self.version)

    async def close_stages(self) -> None:
        for node, _, _ in self.stages:
            with contextlib.suppress(Exception):
                await self.client.call(node, StageCloseOp(pipeline=self.stage_key))

    async def settle_kv(self) -> None:
        """Re-split the stages' KV cache among the head engines when an engine that no
        longer takes requests has drained (`rebalance_kv`), between two steps."""
        if self.groups and self.kv_budgets() != tuple(g.budget_pages for g in self.groups):
            async with self.gate.exclusive():
                self.rebalance_kv()

    def valid_tokens(self) -> list[tuple[int, int]]:
        """(seq id, tokens whose K/V the stages hold) of every running sequence (Eq. 10's
        M_valid); exact only between steps (inside the gate)."""
        return [
            (sid, seq.num_cached)
            for g in self.groups
            for sid, seq in g.engine.seqs.items()
            if seq.num_cached > 0
        ]


@dataclass(frozen=True)
class RefactorResult:
    """What one refactoring did."""

    direction: str
    """`split` (more stages), `merge` (fewer) or `recut` (as many, other layers)."""
    num_stages_before: int
    num_stages_after: int
    num_seqs: int
    """Running sequences whose K/V moved with their layers."""
    num_kv_copies: int
    """Eq. 10's (request, layer) copies carried over the transport."""
    kv_bytes: int
    """K/V bytes that crossed the transport."""
    load_s: float
    """Loading the new stages' blocks (the pipeline served meanwhile)."""
    pause_s: float
    """The gate closed: no step ran (the snapshot and the switch)."""
    kv_bytes_paused: int = 0
    """K/V bytes that crossed the transport during the pause (the top-up, §6.3)."""
    precopy_s: float = 0.0
    """Opening the new stages and copying the K/V while the old ones served."""


def direction_of(before: int, after: int) -> str:
    return "split" if after > before else "merge" if after < before else "recut"


def blocks_of_stage(manifest: Manifest, first: int, end: int) -> list[int]:
    """Blocks a stage over layers [first, end) needs (the embedding and head blocks too:
    `policy.pipeline_adoption.stage_blocks`)."""
    return stage_blocks([(b.first_layer, b.end_layer) for b in manifest.blocks], first, end)


def _spans(stages: Stages) -> list[tuple[int, tuple[int, int]]]:
    return [(node, (a, b)) for node, a, b in stages]


async def _open(pipe: FlexPipeline, key: str, stages: Stages) -> None:
    for i, (node, first, end) in enumerate(stages):
        nxt = stages[i + 1][0] if i + 1 < len(stages) else None
        op = StageOpenOp(
            pipeline=key,
            model=pipe.model,
            first_layer=first,
            end_layer=end,
            next_node=nxt,
            digest=pipe.manifest.digest,
        )
        await pipe.client.call(node, op)


async def _close(pipe: FlexPipeline, key: str, nodes: list[int]) -> None:
    for node in nodes:
        with contextlib.suppress(Exception):  # a dead node has nothing left to close
            await pipe.client.call(node, StageCloseOp(pipeline=key))


async def _move_kv(
    pipe: FlexPipeline,
    old_key: str,
    new_key: str,
    plan: RefactorPlan,
    first: dict[int, int],
) -> tuple[int, set[int]]:
    """Carry out Eq. 10's copies: per (sequence, source stage) one `kv_push` to the source's
    node, which sends each destination its contiguous layers directly, tokens from
    `first[seq]` on. The pushes of all sequences run at once. Returns the bytes moved and
    the sequences whose push failed (one that finished meanwhile: it has nothing left)."""
    wanted: dict[tuple[int, int], dict[int, list[int]]] = {}
    tokens: dict[int, int] = {}
    for kv in plan.kv_copies:
        sid = int(kv.request_id)
        tokens[sid] = kv.num_tokens
        wanted.setdefault((sid, kv.src_slot), {}).setdefault(kv.dst_slot, []).append(kv.block)

    async def push(sid: int, src: int, per_dst: dict[int, list[int]]) -> int:
        # Contiguous: both cuts are contiguous layer ranges.
        targets = tuple(
            KvTarget(node=dst, first_layer=min(layers), end_layer=max(layers) + 1)
            for dst, layers in sorted(per_dst.items())
        )
        op = KvPushOp(
            pipeline=old_key,
            new_pipeline=new_key,
            seq_id=sid,
            num_tokens=tokens[sid],
            targets=targets,
            first_token=first.get(sid, 0),
        )
        return (await pipe.client.call(src, op)).num_bytes

    keys = sorted(wanted)
    sent = await asyncio.gather(
        *(push(sid, src, wanted[(sid, src)]) for sid, src in keys), return_exceptions=True
    )
    failed = set()
    for (sid, src), r in zip(keys, sent, strict=True):
        if isinstance(r, BaseException):
            failed.add(sid)
            log.log(failure_level(r), "%s: K/V of %d from node %d (%s)", pipe.name, sid, src, r)
    return sum(r for r in sent if isinstance(r, int)), failed


async def _copy_kv(
    pipe: FlexPipeline,
    before: Stages,
    target: Stages,
    keys: tuple[str, str],
    copies: list[tuple[int, int, int]],
) -> tuple[int, set[int]]:
    """Copy each (seq, first token, tokens) from the old stages `keys[0]` to the new ones
    `keys[1]`: layers that stay on a node inside it (`stage_kv_copy`), the others as
    Eq. 10 lists them (`_move_kv`). Returns the bytes moved over the transport and the
    sequences some copy of which failed."""
    old_key, new_key = keys
    stay = sorted({n for n, _, _ in before} & {n for n, _, _ in target})

    async def copy_in_place(node: int, sid: int, first: int, n: int) -> None:
        op = StageKvCopyOp(
            pipeline=new_key, source=old_key, seqs=((sid, n),), first_tokens=(first,)
        )
        await pipe.client.call(node, op)

    jobs = [(sid, copy_in_place(node, sid, f, n)) for node in stay for sid, f, n in copies]
    done = await asyncio.gather(*(j for _, j in jobs), return_exceptions=True)
    failed = {sid for (sid, _), r in zip(jobs, done, strict=True) if isinstance(r, BaseException)}
    plan = refactor(_spans(before), _spans(target), [(str(sid), n) for sid, _, n in copies])
    moved, lost = await _move_kv(pipe, old_key, new_key, plan, {sid: f for sid, f, _ in copies})
    return moved, failed | lost


async def refactor_pipeline(
    pipe: FlexPipeline,
    target: Stages,
    load: Callable[[int, list[int]], Awaitable[None]],
    alive: Callable[[], bool] = lambda: True,
    num_micro_batches: int | None = None,
    clock: Clock = REAL_CLOCK,
    batch_retired: bool = False,
) -> RefactorResult:
    """Re-cut `pipe` into `target` stages while it serves (see the module docstring).
    `load(node, blocks)` brings blocks into a node's gpu tier; `alive()` says whether the pipeline
    still serves (the server may retire it meanwhile); `num_micro_batches`: the head
    engines that take requests on the new stages (the caller's policy decision,
    `microbatch.flexpipe_micro_batches`; None: as before), set at the switch. The result's
    times are `clock`'s (the pipeline's server's). `batch_retired`: after a merge the
    engines past the count hand their sequences to those that stay
    (`FlexPipeSettings.batch_merged_sequences`, `PipelineEndpoint.set_micro_batches`).
    Raises on failure, with the old stages still serving unless the pipeline itself
    failed."""
    if pipe.refactoring:
        raise RuntimeError(f"{pipe.name} is already refactoring")
    pipe.refactoring = True
    try:
        t0 = clock.now_s()
        await asyncio.gather(
            *(load(node, blocks_of_stage(pipe.manifest, a, b)) for node, a, b in target)
        )
        load_s = clock.now_s() - t0
        before = list(pipe.stages)
        old_key, new_key = pipe.stage_key, stage_key(pipe.name, pipe.version + 1)
        keys = (old_key, new_key)
        # FlexPipe §6.3: the K/V moves while the old stages keep serving. A snapshot
        # between two steps says what to copy now; the switch later moves only the rest.
        async with pipe.gate.exclusive():
            snapshot_s = clock.now_s()
            copied = pipe.valid_tokens()
            snapshot_s = clock.now_s() - snapshot_s
        t_copy = clock.now_s()
        try:
            await _open(pipe, new_key, target)
            kv_bytes, failed = await _copy_kv(
                pipe, before, target, keys, [(sid, 0, n) for sid, n in copied]
            )
        except BaseException:
            await _close(pipe, new_key, [n for n, _, _ in target])
            raise
        copied = [(sid, n) for sid, n in copied if sid not in failed]  # those go whole
        precopy_s = clock.now_s() - t_copy
        async with pipe.gate.exclusive():
            t1 = clock.now_s()
            try:
                if pipe.failed or not alive():
                    raise EndpointFailed(f"{pipe.name} stopped serving before its refactoring")
                valid = pipe.valid_tokens()
                ups = kv_top_ups([(str(s), n) for s, n in copied], [(str(s), n) for s, n in valid])
                rest = [(int(u.request_id), u.first_token, u.num_tokens) for u in ups]
                paused_bytes, lost = await _copy_kv(pipe, before, target, keys, rest)
                if lost:
                    raise RuntimeError(f"{pipe.name}: K/V of sequences {sorted(lost)} did not move")
                # Sequences copied before that finished meanwhile: free them on the new stages.
                gone = tuple(sorted({s for s, _ in copied} - {s for s, _ in valid}))
                if gone:
                    await pipe.client.call(
                        target[0][0], StageFreeOp(pipeline=new_key, seq_ids=gone)
                    )
                if pipe.failed or not alive():
                    raise EndpointFailed(f"{pipe.name} stopped serving during its refactoring")
            except BaseException:
                await _close(pipe, new_key, [n for n, _, _ in target])
                raise
            kv_bytes += paused_bytes
            for g in pipe.groups:  # the switch: the next step goes to the new stages
                executor = g.engine.executor
                executor.pipeline, executor.head = new_key, target[0][0]  # type: ignore[attr-defined]
            pipe.stages = list(target)
            pipe.nodes = tuple(n for n, _, _ in target)
            pipe.version += 1
            if num_micro_batches is not None:  # new engines start on the new stages
                pipe.set_micro_batches(num_micro_batches, batch_retired)
            await _close(pipe, old_key, [n for n, _, _ in before])
            pause_s = snapshot_s + clock.now_s() - t1
        result = RefactorResult(
            direction=direction_of(len(before), len(target)),
            num_stages_before=len(before),
            num_stages_after=len(target),
            num_seqs=len(valid),
            num_kv_copies=len(copied) + len(rest),
            kv_bytes=kv_bytes,
            load_s=load_s,
            pause_s=pause_s,
            kv_bytes_paused=paused_bytes,
            precopy_s=precopy_s,
        )
        log.info("%s refactored %s -> %s: %s", pipe.name, before, target, result)
        return result
    finally:
        pipe.refactoring = False
