"""Executing a multicast plan from `surge.policy` as flows in virtual time.

In: a `MulticastOutcome` (plan + pipelines), the lead GPU of every plan node, block
sizes, and callbacks. Out: `on_block(node, count)` as blocks arrive,
`on_pipeline(pipeline)` when every stage of a λScale execution pipeline holds its
blocks, `on_complete(node)` when a destination holds the whole model, `on_finished()`
at the end; `on_transfers(+1 / -1)` as a transfer starts / ends.

Execution is self-timed, as node agents run a plan (and as `surge.policy.timing`
models it): each node sends its transfers in plan order and receives its transfers in
plan order; a transfer starts when its block is at the sender and it heads both the
sender's send queue and the receiver's receive queue. Each transfer is a flow on the
cluster's links, so it shares bandwidth with every other transfer in flight.
"""

from collections import deque
from collections.abc import Callable

from surge.policy.multicast import MulticastOutcome
from surge.policy.pipelines import Pipeline
from surge.policy.plan import Transfer
from surge.sim.cluster_state import ClusterState


class MulticastRun:
    """One plan being executed."""

    def __init__(
        self,
        state: ClusterState,
        outcome: MulticastOutcome,
        lead_gpus: list[int],
        block_bytes: int,
        on_block: Callable[[int, int], None],
        on_pipeline: Callable[[Pipeline], None],
        on_complete: Callable[[int], None],
        on_finished: Callable[[], None],
        on_transfers: Callable[[int], None] | None = None,
    ) -> None:
        plan = outcome.plan
        self.state = state
        self.lead = lead_gpus
        self.block_bytes = block_bytes
        self.on_block = on_block
        self.on_pipeline = on_pipeline
        self.on_complete = on_complete
        self.on_finished = on_finished
        self.on_transfers = on_transfers
        n, b, k = plan.num_nodes, plan.num_blocks, plan.num_sources
        self.num_blocks = b
        self.held = [set(range(b)) if v < k else set() for v in range(n)]
        self.sends: list[deque[Transfer]] = [deque() for _ in range(n)]
        self.recvs: list[deque[Transfer]] = [deque() for _ in range(n)]
        for step in plan.steps:
            for tr in step:
                self.sends[tr.src].append(tr)
                self.recvs[tr.dst].append(tr)
        self.active: set[Transfer] = set()
        self.left = sum(len(s) for s in plan.steps)
        self.pipelines = outcome.pipelines
        self.missing: list[int] = []
        self.waiting_on: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(self.pipelines):
            need = [
                (s.node, blk) for s in p.stages for blk in range(s.first_block, s.last_block + 1)
            ]
            self.missing.append(len(need))
            for key in need:
                self.waiting_on.setdefault(key, []).append(i)

    def start(self) -> None:
        """Start every transfer that can start at once."""
        for v in range(len(self.sends)):
            self._try(self.sends[v][0] if self.sends[v] else None)
        if self.left == 0:
            self.on_finished()

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
            self.on_transfers(1)
        path = self.state.gpu_to_gpu(self.lead[tr.src], self.lead[tr.dst])
        self.state.net.start(path, self.block_bytes, lambda: self._done(tr))

    def _done(self, tr: Transfer) -> None:
        self.active.discard(tr)
        if self.on_transfers is not None:
            self.on_transfers(-1)
        self.sends[tr.src].popleft()
        self.recvs[tr.dst].popleft()
        self.left -= 1
        held = self.held[tr.dst]
        new = tr.block not in held
        held.add(tr.block)
        if new:
            for i in self.waiting_on.get((tr.dst, tr.block), ()):
                self.missing[i] -= 1
                if self.missing[i] == 0:
                    self.on_pipeline(self.pipelines[i])
            self.on_block(tr.dst, len(held))
            if len(held) == self.num_blocks:
                self.on_complete(tr.dst)
        for nxt in (
            self.sends[tr.src][0] if self.sends[tr.src] else None,
            self.recvs[tr.dst][0] if self.recvs[tr.dst] else None,
            self.sends[tr.dst][0] if self.sends[tr.dst] else None,
        ):
            self._try(nxt)
        if self.left == 0:
            self.on_finished()
