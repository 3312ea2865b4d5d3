"""The step plan of a multicast: who sends which block to whom, step by step.

In: a strategy's list of steps, each a tuple of `Transfer(src, dst, block)` (or, from
the fast strategies, flat numpy arrays of step, src, dst and block).
Out: a validated, immutable `Plan`, and `arrival_steps(plan)` (when each node holds
each block), which pipelines and the timing model read.

Model (issue 3): nodes 0..N-1, nodes 0..K-1 are sources holding all B blocks at step 0.
Steps are numbered from 1; a transfer in step t has arrived at the end of step t. In
one step a node sends at most one block and receives at most one block (full-duplex
single port), and it can only send a block it held at the start of the step.

Speed (issue 12): validation is vectorised over all transfers (numpy); only a plan
that fails it is replayed transfer by transfer, to name the first broken rule.
"""

import functools
import itertools
from dataclasses import dataclass

import numpy as np

NEVER = -1
"""`arrival_steps` value for a block a node never receives (only in invalid plans)."""


class PlanInvariantError(AssertionError):
    """A plan breaks the step model: a bug in the strategy that built it, never user error."""


@dataclass(frozen=True, order=True)
class Transfer:
    """One block moving over one link during one step."""

    src: int
    """Sending node; must hold `block` at the start of the step."""
    dst: int
    """Receiving node; holds `block` from the end of the step."""
    block: int
    """Block index in layer order, 0..B-1."""


@dataclass(frozen=True, eq=False)
class TransferArrays:
    """A plan's transfers as flat int64 arrays, in plan order (step, then receiver)."""

    step: np.ndarray
    """Step of each transfer, from 1."""
    src: np.ndarray
    """Sender of each transfer."""
    dst: np.ndarray
    """Receiver of each transfer."""
    block: np.ndarray
    """Block of each transfer."""
    step_starts: np.ndarray
    """Index of the first transfer of step t at step_starts[t-1]; S+1 entries."""


@dataclass(frozen=True)
class Plan:
    """A complete multicast schedule; construct it with `make_plan` so it is validated."""

    strategy: str
    """Name of the strategy that built the plan (`binomial`, `chain`, ...)."""
    num_nodes: int
    """N: nodes 0..N-1 take part."""
    num_blocks: int
    """B: the model is split into blocks 0..B-1 in layer order."""
    num_sources: int
    """K: nodes 0..K-1 hold every block at step 0."""
    steps: tuple[tuple[Transfer, ...], ...]
    """steps[t-1] holds the transfers of step t."""

    @property
    def complete_step(self) -> int:
        """The step at whose end every node holds every block (0 if nothing moves)."""
        return len(self.steps)

    @functools.cached_property
    def arrays(self) -> TransferArrays:
        """The transfers as numpy arrays, computed once (pipelines and timing read them)."""
        sizes = np.fromiter((len(s) for s in self.steps), dtype=np.int64, count=len(self.steps))
        total = int(sizes.sum())
        flat = [tr for s in self.steps for tr in s]
        starts = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        return TransferArrays(
            step=np.repeat(np.arange(1, len(sizes) + 1, dtype=np.int64), sizes),
            src=np.fromiter((tr.src for tr in flat), dtype=np.int64, count=total),
            dst=np.fromiter((tr.dst for tr in flat), dtype=np.int64, count=total),
            block=np.fromiter((tr.block for tr in flat), dtype=np.int64, count=total),
            step_starts=starts,
        )


def initial_holdings(num_nodes: int, num_blocks: int, num_sources: int) -> list[set[int]]:
    """Blocks held by each node at step 0: everything on sources, nothing elsewhere."""
    return [set(range(num_blocks)) if n < num_sources else set() for n in range(num_nodes)]


def arrival_matrix(plan: Plan) -> np.ndarray:
    """arrival[node, block] as an int64 (N, B) array; see `arrival_steps`."""
    n, b = plan.num_nodes, plan.num_blocks
    arr = plan.arrays
    unset = np.iinfo(np.int64).max
    arrival = np.full(n * b, unset, dtype=np.int64)
    inside = (arr.dst >= 0) & (arr.dst < n) & (arr.block >= 0) & (arr.block < b)
    # The earliest transfer of a (node, block) counts, as in a replay.
    np.minimum.at(arrival, arr.dst[inside] * b + arr.block[inside], arr.step[inside])
    arrival = arrival.reshape(n, b)
    arrival[arrival == unset] = NEVER
    arrival[: plan.num_sources] = 0
    return arrival


def arrival_steps(plan: Plan) -> list[list[int]]:
    """arrival[node][block]: the step at whose end `node` holds `block` (0 on sources)."""
    return arrival_matrix(plan).tolist()


def completion_steps(plan: Plan) -> list[int]:
    """For each node, the step at whose end it holds every block (0 for sources)."""
    return [max(row) if row else 0 for row in arrival_steps(plan)]


def _arrays_obey_step_model(
    num_nodes: int, num_blocks: int, num_sources: int, arr: TransferArrays
) -> bool:
    """True iff the transfers pass every check of `validate_plan` (vectorised).

    With each (receiver, block) received at most once and never by a source, "holds
    the block" is "received it in an earlier step", so all rules are array tests.
    """
    n, b, k = num_nodes, num_blocks, num_sources
    if n < 2 or b < 1 or not 1 <= k < n:
        return False
    if np.any(np.diff(arr.step_starts) <= 0):
        return False  # an empty step
    src, dst, block, step = arr.src, arr.dst, arr.block, arr.step
    if src.size != (n - k) * b:
        return False  # some block delivered twice or never
    in_range = (src >= 0) & (src < n) & (dst >= 0) & (dst < n) & (block >= 0) & (block < b)
    if not in_range.all() or np.any(src == dst) or np.any(dst < k):
        return False
    for node in (src, dst):  # one send and one receive per node and step
        keys = np.sort(step * n + node)
        if np.any(keys[1:] == keys[:-1]):
            return False
    cells = dst * b + block
    if np.bincount(cells, minlength=n * b).max() > 1:
        return False  # with the count above, now every destination cell is received once
    arrival = np.zeros(n * b, dtype=np.int64)
    arrival[cells] = step
    return bool(np.all(arrival[src * b + block] < step))


def replay_first_error(plan: Plan) -> None:
    """Replay `plan` transfer by transfer; raise `PlanInvariantError` at the first broken rule."""
    n, b, k = plan.num_nodes, plan.num_blocks, plan.num_sources
    if n < 2 or b < 1 or not 1 <= k < n:
        raise PlanInvariantError(f"bad plan sizes: nodes={n} blocks={b} sources={k}")
    held = initial_holdings(n, b, k)
    for step_index, transfers in enumerate(plan.steps, start=1):
        if not transfers:
            raise PlanInvariantError(f"step {step_index} is empty")
        senders: set[int] = set()
        receivers: set[int] = set()
        for tr in transfers:
            where = f"step {step_index}, {tr}"
            if not (0 <= tr.src < n and 0 <= tr.dst < n and 0 <= tr.block < b):
                raise PlanInvariantError(f"{where}: node or block out of range")
            if tr.src == tr.dst:
                raise PlanInvariantError(f"{where}: a node sends to itself")
            if tr.src in senders:
                raise PlanInvariantError(f"{where}: node {tr.src} sends twice in one step")
            if tr.dst in receivers:
                raise PlanInvariantError(f"{where}: node {tr.dst} receives twice in one step")
            if tr.block not in held[tr.src]:
                raise PlanInvariantError(f"{where}: sender does not hold the block yet")
            if tr.block in held[tr.dst]:
                raise PlanInvariantError(f"{where}: receiver already holds the block")
            senders.add(tr.src)
            receivers.add(tr.dst)
        for tr in transfers:
            held[tr.dst].add(tr.block)
    for node, blocks in enumerate(held):
        if len(blocks) != b:
            missing = sorted(set(range(b)) - blocks)
            raise PlanInvariantError(f"node {node} never receives blocks {missing}")


def validate_plan(plan: Plan) -> None:
    """Raise `PlanInvariantError` unless `plan` obeys the step model and delivers everything.

    Checks: sizes are sane; every transfer names real nodes and blocks; per step no node
    sends or receives more than one block; a sender holds the block at the start of the
    step; nobody receives a block it already holds; no empty step; at the end every node
    holds every block.
    """
    if _arrays_obey_step_model(plan.num_nodes, plan.num_blocks, plan.num_sources, plan.arrays):
        return
    replay_first_error(plan)
    raise PlanInvariantError(f"plan {plan.strategy} fails the vectorised checks only (a bug)")


def make_plan(
    strategy: str,
    num_nodes: int,
    num_blocks: int,
    num_sources: int,
    steps: list[list[Transfer]],
) -> Plan:
    """Freeze `steps` into a `Plan` (transfers sorted by receiver) and validate it."""
    frozen = tuple(tuple(sorted(s, key=_receiver_then_sender)) for s in steps if s)
    plan = Plan(strategy, num_nodes, num_blocks, num_sources, frozen)
    validate_plan(plan)
    return plan


def _receiver_then_sender(tr: Transfer) -> tuple[int, int]:
    return tr.dst, tr.src


def plan_from_arrays(
    strategy: str,
    num_nodes: int,
    num_blocks: int,
    num_sources: int,
    step: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    block: np.ndarray,
) -> Plan:
    """`make_plan` for transfers given as flat arrays (step numbers need not be dense).

    Same result as `make_plan` on the same transfers: empty steps dropped, each step
    sorted by (receiver, sender), validated; but checked before any `Transfer` exists.
    """
    order = np.lexsort((src, dst, step))
    step, src, dst, block = (np.asarray(a, dtype=np.int64)[order] for a in (step, src, dst, block))
    _, dense = np.unique(step, return_inverse=True)
    dense = dense.astype(np.int64) + 1
    sizes = np.bincount(dense, minlength=int(dense[-1]) + 1 if dense.size else 1)[1:]
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    arrays = TransferArrays(dense, src, dst, block, starts)
    flat = list(map(Transfer, src.tolist(), dst.tolist(), block.tolist()))
    bounds = starts.tolist()
    steps = tuple(tuple(flat[a:z]) for a, z in itertools.pairwise(bounds))
    plan = Plan(strategy, num_nodes, num_blocks, num_sources, steps)
    plan.__dict__["arrays"] = arrays  # what the cached property would compute
    if not _arrays_obey_step_model(num_nodes, num_blocks, num_sources, arrays):
        replay_first_error(plan)
        raise PlanInvariantError(f"plan {strategy} fails the vectorised checks only (a bug)")
    return plan
