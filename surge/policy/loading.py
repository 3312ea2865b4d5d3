"""Serve-while-loading: which endpoints open and retire as a model's blocks arrive.

In: the planned execution pipelines of a multicast (`surge.policy.multicast.scale_out`), the plan's
size (N nodes, B blocks, K sources that hold everything from the start), how the system
serves while loading (`SystemConfig.serve_while_loading`), then one `(node, block)`
arrival at a time. Out: for each arrival, the actions to carry out, in order:
- `OpenPipeline(index)`: every stage of planned pipeline `index` holds its blocks, and no
  member holds the whole model yet: open it as an endpoint (λScale §4.3);
- `GoLive(node)`: the node holds `live_start_fraction` of the blocks: it starts serving
  cooperatively (BlitzScale §4, live scaling);
- `GoLocal(node)`: the node holds every block: it serves alone;
- `RetirePipeline(index)`: right after its last member went local (every member holds the
  whole model, λScale §4.4 "after model scaling is complete"), an open pipeline retires
  and its unfinished requests are spread evenly over its members (`spread_evenly`), each
  of which rebuilds their KV cache by recomputation (the mode switch).
A pipeline one of whose members is already complete never opens (that member serves alone
instead). With `none` (load-then-serve) only `GoLocal` is emitted.

The runtime (`surge serve`'s scale-out) and the simulator both feed arrivals here and carry
out what comes back, so the same arrival order opens and retires the same pipelines in the
same order in both bodies. Pure and deterministic.
"""

from dataclasses import dataclass

from surge.errors import SurgeError
from surge.policy.multicast.pipelines import Pipeline

MODES = ("none", "pipelines", "live")


@dataclass(frozen=True)
class OpenPipeline:
    """Open planned pipeline `index` as an endpoint."""

    index: int
    pipeline: Pipeline


@dataclass(frozen=True)
class GoLive:
    """`node` may serve cooperatively while the rest of its blocks arrive."""

    node: int


@dataclass(frozen=True)
class GoLocal:
    """`node` holds the whole model: it serves alone."""

    node: int


@dataclass(frozen=True)
class RetirePipeline:
    """Retire open pipeline `index`; its unfinished requests, in admission order, go to
    its members as `spread_evenly` says (λScale §4.4 mode switch)."""

    index: int
    pipeline: Pipeline


def spread_evenly(
    num_requests: int, loads: tuple[int, ...], capacities: tuple[int, ...]
) -> tuple[int | None, ...]:
    """Where each of a retired pipeline's `num_requests` unfinished requests (admission
    order) moves: the index of a member, or None (no member has room: the head of the
    queue, which the router serves). λScale §4.4 "evenly distributes incomplete requests
    of an execution pipeline among all participating nodes", each recomputing their KV
    cache locally (cheaper than all-to-all KV transfers). Evenly by load: each request
    goes to the member with the fewest requests (`loads`: in flight there now, plus
    those given so far; ties to the first in stage order), so members that started
    equal get them round robin, and none is filled past its `capacities` (a member that
    went local before its pipeline retired may already be serving others)."""
    if not loads or len(loads) != len(capacities):
        raise SurgeError("a pipeline's requests need one load and one capacity per member")
    if num_requests < 0:
        raise SurgeError(f"num_requests must be >= 0 (got {num_requests})")
    load = list(loads)
    out: list[int | None] = []
    for _ in range(num_requests):
        i = min(range(len(load)), key=lambda m: (load[m] - capacities[m] >= 0, load[m], m))
        if load[i] >= capacities[i]:
            out.append(None)
            continue
        load[i] += 1
        out.append(i)
    return tuple(out)


LoadingAction = OpenPipeline | GoLive | GoLocal | RetirePipeline


@dataclass(frozen=True)
class LoadingSettings:
    """How one scale-out serves while loading. Validated at construction."""

    num_nodes: int
    """N: plan nodes 0..N-1."""
    num_blocks: int
    """B: blocks of the model."""
    num_sources: int
    """K: plan nodes 0..K-1 hold every block from the start (0: warm nodes loading from
    their own host memory, `policy.warm_pipelines`)."""
    pipelines: tuple[Pipeline, ...] = ()
    """The plan's execution pipelines (`MulticastOutcome.pipelines`)."""
    mode: str = "pipelines"
    """`none`, `pipelines` or `live` (`SystemConfig.serve_while_loading`)."""
    live_start_fraction: float = 0.5
    """With `live`: the fraction of blocks after which a node serves cooperatively."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SurgeError(f"serve-while-loading mode must be one of {MODES} (got {self.mode!r})")
        if not 0 <= self.num_sources <= self.num_nodes or self.num_blocks < 1:
            raise SurgeError("loading needs 0 <= sources <= nodes and >= 1 block")
        if not 0 < self.live_start_fraction <= 1:
            raise SurgeError("live_start_fraction must be in (0, 1]")
        for p in self.pipelines:
            for s in p.stages:
                if not (0 <= s.node < self.num_nodes and s.last_block < self.num_blocks):
                    raise SurgeError(f"pipeline stage {s} is outside the plan")


class LoadingState:
    """The serve-while-loading state of one scale-out; `arrive` is its only input."""

    def __init__(self, settings: LoadingSettings) -> None:
        self.settings = settings
        n, b, k = settings.num_nodes, settings.num_blocks, settings.num_sources
        self.held: list[set[int]] = [set(range(b)) if v < k else set() for v in range(n)]
        self.live: set[int] = set()
        use = settings.mode == "pipelines"
        self.pending: list[int] = list(range(len(settings.pipelines))) if use else []
        """Pipelines not opened yet, in plan order."""
        self.open: list[int] = []
        """Open pipelines, in the order they opened."""
        self._missing = [
            sum(s.last_block - s.first_block + 1 for s in p.stages) for p in settings.pipelines
        ]
        self._waiting: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(settings.pipelines):
            for s in p.stages:
                for blk in range(s.first_block, s.last_block + 1):
                    if blk in self.held[s.node]:
                        self._missing[i] -= 1
                    else:
                        self._waiting.setdefault((s.node, blk), []).append(i)

    def complete(self, node: int) -> bool:
        """Whether `node` holds every block."""
        return len(self.held[node]) == self.settings.num_blocks

    def arrive(self, node: int, block: int) -> tuple[LoadingAction, ...]:
        """Block `block` landed on plan node `node`: what to do now, in order."""
        s = self.settings
        if not (0 <= node < s.num_nodes and 0 <= block < s.num_blocks):
            raise SurgeError(f"arrival of block {block} on node {node} is outside the plan")
        held = self.held[node]
        if block in held:
            return ()  # a duplicate (a re-sent block): nothing changes
        held.add(block)
        for i in self._waiting.pop((node, block), ()):
            self._missing[i] -= 1
        actions: list[LoadingAction] = []
        pipes = s.pipelines
        if self.complete(node):
            # A complete member serves alone: its pending pipelines never open. Its open
            # ones keep serving until every member is complete, then retire and spread
            # their requests over all members (λScale §4.4: the switch comes "after model
            # scaling is complete, each node maintains a full model instance"; in a
            # binomial plan a pipeline's members complete in the same step).
            self.pending = [i for i in self.pending if node not in pipes[i].nodes]
            self.live.discard(node)
            actions.append(GoLocal(node))
            for i in [i for i in self.open if node in pipes[i].nodes]:
                if all(self.complete(v) for v in pipes[i].nodes):
                    self.open.remove(i)
                    actions.append(RetirePipeline(i, pipes[i]))
            return tuple(actions)
        live_now = len(held) >= s.live_start_fraction * s.num_blocks
        if s.mode == "live" and node not in self.live and live_now:
            self.live.add(node)
            actions.append(GoLive(node))
        for i in list(self.pending):
            if self._missing[i] == 0 and not any(self.complete(v) for v in pipes[i].nodes):
                self.pending.remove(i)
                self.open.append(i)
                actions.append(OpenPipeline(i, pipes[i]))
        return tuple(actions)
