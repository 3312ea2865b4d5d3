"""A pipelined engine's prefills, micro-batch by micro-batch (the runtime's pipeline head).

In: the requests one prefill step of a pipelined `Batcher` admits (`sim/batching.py`), the
micro-batches in flight, each request's prefill work. Out: the requests grouped by the
micro-batch they join (`policy.pipeline_batches.spread_over_micro_batches`, over the
requests each micro-batch holds, tracked here), and when each micro-batch's prefill leaves
the last stage (`stage_ends_s`): the micro-batches go through the stages one after
another, each stage one micro-batch at a time, as the runtime's head engines do (one per
micro-batch, `runtime/endpoints.py`). Before, the simulator prefilled the admitted
requests as one batch through every layer: a burst's first tokens all came after the
whole burst's prefill (FlexPipe §9 static 8-stage pipelines: 0.40 s vs the emulated
runtime's 0.14-0.21 s, docs/emulation.md). Owned by sim/.
"""

from collections.abc import Callable, Sequence

from surge.policy.pipeline_batches import spread_over_micro_batches
from surge.sim.request import SimRequest


def stage_ends_s(works_s: Sequence[float], num_stages: int) -> tuple[float, ...]:
    """When each micro-batch (in order; `works_s`: its prefill through every layer) leaves
    the last of `num_stages` equal stages, from the start: a stage takes 1/num_stages of a
    micro-batch's work, one micro-batch at a time, in order."""
    stages = max(1, num_stages)
    free = [0.0] * stages  # when each stage is free
    out = []
    for work in works_s:
        t = 0.0
        for k in range(stages):
            t = max(t, free[k]) + work / stages
            free[k] = t
        out.append(t)
    return tuple(out)


class MicroBatchLoads:
    """Which micro-batch each request of one pipelined engine is in."""

    def __init__(self) -> None:
        self.group_of: dict[int, int] = {}
        """Request id -> its micro-batch."""
        self.loads: list[int] = []
        """Requests each micro-batch holds."""

    def split(self, batch: list[SimRequest], count: int) -> list[list[SimRequest]]:
        """`batch` (admitted together, in order) over the first `count` micro-batches:
        the non-empty groups, in the order of their first request."""
        while len(self.loads) < count:
            self.loads.append(0)
        picks = spread_over_micro_batches(self.loads[:count], len(batch))
        groups: dict[int, list[SimRequest]] = {}
        for req, g in zip(batch, picks, strict=True):
            self.leave(req)  # a recomputed request joins afresh
            groups.setdefault(g, []).append(req)
            self.group_of[req.id] = g
            self.loads[g] += 1
        return list(groups.values())

    def leave(self, req: SimRequest) -> None:
        """`req` finished or left the engine."""
        g = self.group_of.pop(req.id, None)
        if g is not None:
            self.loads[g] -= 1

    def clear(self) -> None:
        """The engine drained."""
        self.group_of.clear()
        self.loads = [0] * len(self.loads)


def plan_prefill(
    batch: list[SimRequest],
    micro_batches: int,
    loads: MicroBatchLoads,
    work_s: Callable[[list[SimRequest]], float],
) -> tuple[list[SimRequest], float, list[float]]:
    """One prefill step of the admitted `batch`: the requests in prefill order, how long the
    step holds the engine and each one's first token after that (seconds at rate 1;
    `work_s`: a group's prefill through every layer). Not pipelined (`micro_batches` 1):
    one batch through every layer. Pipelined: one prefill per micro-batch (`loads.split`),
    the step holding the first stage's share of them all, each micro-batch's first tokens
    as it leaves the last stage (`stage_ends_s`; may come before the step ends when a
    larger micro-batch follows it)."""
    if micro_batches <= 1:
        return batch, work_s(batch), [0.0] * len(batch)
    groups = loads.split(batch, micro_batches)
    works = [work_s(g) for g in groups]
    held_s = sum(works) / micro_batches
    ends = stage_ends_s(works, micro_batches)
    after = [end - held_s for g, end in zip(groups, ends, strict=True) for _ in g]
    return [r for g in groups for r in g], held_s, after
