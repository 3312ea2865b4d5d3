"""Whether the pipeline stages the agents report make one whole pipeline a restarted
controller can adopt (`policy.adoption`).

An execution pipeline (λScale §4.3; a ParaServe group, §4) is one serving instance spread
over several nodes: each node runs a stage, a contiguous layer range of the model over its
own device blocks, and hands its output to the next stage's node (`StageOpenOp.next_node`);
the head engines that schedule and sample live in the controller, so they went with the old
one, but the stages and their weights did not. The stages, in the order they hand on, are
exactly the pipeline the controller would have built (`PipelineEndpoint(stages=...)`) when:
- every stage runs the store's version of the model (`Manifest.digest`);
- one stage starts at layer 0, each hands on to a reported stage that starts where it ends
  (no gap, no overlap, no loop), and the last hands on to no one and ends at the last layer;
- every reported stage is on that chain;
- each stage's node holds every block its layers need on the device (not half-loaded);
- no stage belongs to a live prefill (`compute_group`: BlitzScale §5.2's cooperative
  prefill, one batch's and gone with it, never a serving pipeline).
Anything else is a missing, half-loaded or mismatched stage: the pipeline is closed, with
`chain`'s reason. Pure: no I/O.
"""

from collections.abc import Sequence
from dataclasses import dataclass

Stages = tuple[tuple[int, int, int], ...]
"""(node, first_layer, end_layer) per stage, in layer order."""


@dataclass(frozen=True)
class SeenStage:
    """One stage of a pipeline as its node's agent reports it."""

    node: int
    first_layer: int
    end_layer: int
    next_node: int | None
    digest: str
    """The digest of the manifest the node runs the model with."""
    gpu: frozenset[int]
    """The model's blocks whose device copy on the node is whole."""
    compute_group: str | None = None


@dataclass(frozen=True)
class Layout:
    """The stored model's version and its blocks' layers."""

    digest: str
    block_layers: tuple[tuple[int, int], ...]
    """Each block's [first_layer, end_layer), by block index (the embedding is in block 0,
    the head in the last)."""

    @property
    def num_layers(self) -> int:
        return max((end for _, end in self.block_layers), default=0)


def stage_blocks(block_layers: Sequence[tuple[int, int]], first: int, end: int) -> list[int]:
    """Blocks a stage over layers [first, end) needs: those holding its layers, the
    embedding's (block 0) at the head, the output head's (the last block) at the tail."""
    needed = {b for b, (lo, hi) in enumerate(block_layers) if lo < end and hi > first}
    if first == 0:
        needed.add(0)
    if end == max((hi for _, hi in block_layers), default=0):
        needed.add(len(block_layers) - 1)
    return sorted(needed)


def chain(stages: Sequence[SeenStage], layout: Layout) -> Stages | str:
    """The stages as the pipeline the controller would have built, in the order they hand
    on, or why they are not one whole pipeline of the stored version (module docstring)."""
    if not layout.block_layers:
        return "the store's layout is not known"
    for s in stages:
        if s.compute_group is not None:
            return f"a live prefill's stage on node {s.node} (group {s.compute_group!r})"
        if s.end_layer <= s.first_layer:
            return f"node {s.node} reports no layer range for its stage (an older agent)"
        if s.digest != layout.digest:
            return f"node {s.node}'s stage runs another version of the model"
    order = _walk(stages, layout.num_layers)
    if isinstance(order, str):
        return order
    for s in order:
        missing = sorted(set(stage_blocks(layout.block_layers, s.first_layer, s.end_layer)) - s.gpu)
        if missing:
            span = f"{s.first_layer}-{s.end_layer - 1}"
            return f"half-loaded: node {s.node} lacks blocks {missing} of its layers {span}"
    return tuple((s.node, s.first_layer, s.end_layer) for s in order)


def _walk(stages: Sequence[SeenStage], num_layers: int) -> list[SeenStage] | str:
    """The stages from the one at layer 0 along `next_node`, checked to meet end to end."""
    heads = [s for s in stages if s.first_layer == 0]
    if len(heads) != 1:
        return "a stage is missing: none starts at layer 0" if not heads else "two heads"
    by_node = {s.node: s for s in stages}
    order = [heads[0]]
    while (nxt := order[-1].next_node) is not None:
        cur, s = order[-1], by_node.get(nxt)
        if s is None:
            return f"a stage is missing: node {cur.node}'s hands on to node {nxt}, which has none"
        if s in order:
            return f"the stages hand on in a loop (node {cur.node} to node {nxt})"
        if s.first_layer != cur.end_layer:
            return (
                f"stage order gap: node {cur.node}'s ends at layer {cur.end_layer}, "
                f"the next (node {nxt}) starts at {s.first_layer}"
            )
        order.append(s)
    if order[-1].end_layer != num_layers:
        last = order[-1]
        return (
            f"a stage is missing: the last (node {last.node}) ends at layer "
            f"{last.end_layer} of {num_layers}"
        )
    if len(order) != len(stages):
        off = sorted(s.node for s in stages if s not in order)
        return f"stages on nodes {off} are not on the pipeline's chain"
    return order
