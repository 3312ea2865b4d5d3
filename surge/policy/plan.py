"""The step plan of a multicast: who sends which block to whom, step by step.

In: a strategy's list of steps, each a tuple of `Transfer(src, dst, block)`.
Out: a validated, immutable `Plan`, and `arrival_steps(plan)` (when each node holds
each block), which pipelines and the timing model read.

Model (issue 3): nodes 0..N-1, nodes 0..K-1 are sources holding all B blocks at step 0.
Steps are numbered from 1; a transfer in step t has arrived at the end of step t. In
one step a node sends at most one block and receives at most one block (full-duplex
single port), and it can only send a block it held at the start of the step.
"""

from dataclasses import dataclass

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


def initial_holdings(num_nodes: int, num_blocks: int, num_sources: int) -> list[set[int]]:
    """Blocks held by each node at step 0: everything on sources, nothing elsewhere."""
    return [set(range(num_blocks)) if n < num_sources else set() for n in range(num_nodes)]


def arrival_steps(plan: Plan) -> list[list[int]]:
    """arrival[node][block]: the step at whose end `node` holds `block` (0 on sources)."""
    arrival = [
        [0 if n < plan.num_sources else NEVER for _ in range(plan.num_blocks)]
        for n in range(plan.num_nodes)
    ]
    for step_index, transfers in enumerate(plan.steps, start=1):
        for tr in transfers:
            if arrival[tr.dst][tr.block] == NEVER:
                arrival[tr.dst][tr.block] = step_index
    return arrival


def completion_steps(plan: Plan) -> list[int]:
    """For each node, the step at whose end it holds every block (0 for sources)."""
    return [max(row) if row else 0 for row in arrival_steps(plan)]


def validate_plan(plan: Plan) -> None:
    """Raise `PlanInvariantError` unless `plan` obeys the step model and delivers everything.

    Checks: sizes are sane; every transfer names real nodes and blocks; per step no node
    sends or receives more than one block; a sender holds the block at the start of the
    step; nobody receives a block it already holds; no empty step; at the end every node
    holds every block.
    """
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


def make_plan(
    strategy: str,
    num_nodes: int,
    num_blocks: int,
    num_sources: int,
    steps: list[list[Transfer]],
) -> Plan:
    """Freeze `steps` into a `Plan` (transfers sorted by receiver) and validate it."""
    frozen = tuple(tuple(sorted(s, key=lambda tr: (tr.dst, tr.src))) for s in steps if s)
    plan = Plan(strategy, num_nodes, num_blocks, num_sources, frozen)
    validate_plan(plan)
    return plan
