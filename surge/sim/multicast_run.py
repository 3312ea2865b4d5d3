"""Executing a multicast plan from `surge.policy` as flows in virtual time.

In: a `Plan` (from `surge.policy.multicast.scale_out.plan_scale_out`), the link path between two
plan nodes (the caller resolves what a node is: a GPU, or the host memory of a machine
for a host source), the block size, and callbacks. Out: `on_arrival(node, block)` as
each block lands (the caller feeds it to `surge.policy.loading.LoadingState`, which
decides what opens and retires), `on_finished()` at the end, and `on_transfers(+1 / -1,
transfer)` as a transfer starts / ends (for the host model, `sim/host.py`).

Execution is self-timed, as node agents run a plan (and as `surge.policy.multicast.timing`
models it): each node sends its transfers in plan order and receives its transfers in
plan order; a transfer starts when its block is at the sender and it heads both the
sender's send queue and the receiver's receive queue. A source still receiving an earlier
multicast (`partial_sources`, a chain's tail) holds only the blocks landed so far;
`source_got` adds the rest as they land. Each transfer is a flow on the cluster's links,
so it shares bandwidth with every other transfer in flight.
"""

from collections import deque
from collections.abc import Callable

from surge.policy.multicast.plan import Plan, Transfer
from surge.sim.flows import FlowNetwork, Link


class MulticastRun:
    """One plan being executed."""

    def __init__(
        self,
        net: FlowNetwork,
        plan: Plan,
        path: Callable[[int, int], tuple[Link, ...]],
        block_bytes: int,
        on_arrival: Callable[[int, int], None],
        on_finished: Callable[[], None],
        on_transfers: Callable[[int, Transfer], None] | None = None,
        partial_sources: dict[int, set[int]] | None = None,
    ) -> None:
        self.net = net
        self.path = path
        self.block_bytes = block_bytes
        self.on_arrival = on_arrival
        self.on_finished = on_finished
        self.on_transfers = on_transfers
        n, b, k = plan.num_nodes, plan.num_blocks, plan.num_sources
        self.held = [set(range(b)) if v < k else set() for v in range(n)]
        for v, blocks in (partial_sources or {}).items():
            # a source still receiving (a chain's tail): it forwards blocks as they land
            self.held[v] = set(blocks)
        self.sends: list[deque[Transfer]] = [deque() for _ in range(n)]
        self.recvs: list[deque[Transfer]] = [deque() for _ in range(n)]
        for step in plan.steps:
            for tr in step:
                self.sends[tr.src].append(tr)
                self.recvs[tr.dst].append(tr)
        self.active: set[Transfer] = set()
        self.left = sum(len(s) for s in plan.steps)

    def start(self) -> None:
        """Start every transfer that can start at once."""
        for v in range(len(self.sends)):
            self._try(self.sends[v][0] if self.sends[v] else None)
        if self.left == 0:
            self.on_finished()

    def source_got(self, node: int, block: int) -> None:
        """Source `node` (one of `partial_sources`) now holds `block`: send it on."""
        self.held[node].add(block)
        self._try(self.sends[node][0] if self.sends[node] else None)

    def _try(self, tr: Transfer | None) -> None:
        if tr is None or tr in self.active:
            return
        if tr.block not in self.held[tr.src]:
            return
        if not self.sends[tr.src] or self.sends[tr.src][0] != tr:
            return
        if not self.recvs[tr.dst] or self.recvs[tr.dst][0] != tr:
            return
        self.active.add(tr)
        if self.on_transfers is not None:
            self.on_transfers(1, tr)
        self.net.start(self.path(tr.src, tr.dst), self.block_bytes, lambda: self._done(tr))

    def _done(self, tr: Transfer) -> None:
        self.active.discard(tr)
        if self.on_transfers is not None:
            self.on_transfers(-1, tr)
        self.sends[tr.src].popleft()
        self.recvs[tr.dst].popleft()
        self.left -= 1
        held = self.held[tr.dst]
        if tr.block not in held:
            held.add(tr.block)
            self.on_arrival(tr.dst, tr.block)
        for nxt in (
            self.sends[tr.src][0] if self.sends[tr.src] else None,
            self.recvs[tr.dst][0] if self.recvs[tr.dst] else None,
            self.sends[tr.dst][0] if self.sends[tr.dst] else None,
        ):
            self._try(nxt)
        if self.left == 0:
            self.on_finished()
