"""Carrying out a multicast plan with real agents, and recovering when one dies.

In: a `Plan` from `surge.policy` (nodes 0..N-1 of the plan mapped to agent ids), the model
(already registered on every agent, blocks on the sources), the tier blocks land in.
Out: a `MulticastResult` with every block arrival (node, block, seconds since start), the
completion time, the measured first-serving-capacity time for the plan's pipelines, and the
re-plans made.

Each agent gets only its own receive list and runs it without a global barrier (see
`runtime/node/transfer.py`). This module subscribes to the plan's events; when a pull fails —
the source died or kept sending corrupt bytes — it names another live holder of that block
(`policy.multicast.replan.replan_source`: sources first, then the earliest receiver in the
plan's order), waiting for one to exist if none does yet.
Nodes that were downstream of a dead node recover the same way, transitively.
"""

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from surge.policy.multicast.pipelines import Pipeline
from surge.policy.multicast.plan import Plan
from surge.policy.multicast.replan import replan_source
from surge.policy.multicast.timing import first_capacity_s
from surge.runtime.client import ClusterClient
from surge.runtime.protocol import (
    AgentDown,
    BlockArrived,
    BlockCorrupt,
    Event,
    LandingTier,
    MulticastOp,
    PullFailed,
    PullFromOp,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupTimes:
    """What one gloo group broadcast measured (real seconds)."""

    setup_s: float | None
    """From the controller's first `group_broadcast` until the last member's group was
    ready (the rendezvous and gloo's connections among all members, and under emulation
    the floor of the emulated communicator's creation): the group's creation."""
    member_setup_s: tuple[float | None, ...]
    """Each member's own forming time, from its op to its group (rank order; real work,
    without the emulation's floor)."""
    broadcast_s: float | None
    """The slowest member's time from its group formed to its last block."""
    num_bytes: int
    """Bytes one target received (the model's)."""
    errors: tuple[str, ...] = ()
    """Why members failed (empty: the group moved every block)."""
    fell_back: bool = False
    """The group could not start: the plan's block pulls moved the model instead."""


@dataclass
class MulticastResult:
    """What happened during one multicast (plan node numbering)."""

    plan: Plan
    arrival_s: list[list[float | None]]
    """arrival_s[node][block]: seconds from start until the node held the block (0 on
    sources, None if it never arrived)."""
    arrival_order: list[list[int]]
    """Blocks in the order each node received them."""
    complete_s: float | None
    """When every live node held every block (None on timeout)."""
    first_pipeline_s: float | None
    """When the first new serving capacity existed (first pipeline or full node)."""
    dead_nodes: list[int] = field(default_factory=list)
    replans: list[dict[str, Any]] = field(default_factory=list)
    corrupt_refetches: int = 0
    events: list[Event] = field(default_factory=list)
    """This multicast's events (arrivals, failed pulls, corrupt blocks, agents down)."""
    group: GroupTimes | None = None
    """With a gloo group broadcast (`runtime/collective.py`): its measured times."""


class MulticastExecutor:
    """Drives one plan on a `ClusterClient` (whose event queue it consumes)."""

    def __init__(
        self,
        client: ClusterClient,
        model: str,
        plan: Plan,
        agents: Sequence[int] | None = None,
        tier: LandingTier = "host",
        pipelines: Sequence[Pipeline] = (),
        timeout_s: float = 300.0,
    ) -> None:
        self.client = client
        self.model = model
        self.plan = plan
        self.agents = list(agents) if agents is not None else list(range(plan.num_nodes))
        if len(self.agents) != plan.num_nodes:
            raise ValueError(f"plan has {plan.num_nodes} nodes but {len(self.agents)} agents given")
        self.node_of = {a: i for i, a in enumerate(self.agents)}
        self.tier = tier
        self.pipelines = list(pipelines)
        self.timeout_s = timeout_s
        self.mc_id = secrets.token_hex(4)
        n, b = plan.num_nodes, plan.num_blocks
        self.holds: list[set[int]] = [
            set(range(b)) if v < plan.num_sources else set() for v in range(n)
        ]
        self.first_holder_t: dict[int, list[tuple[float, int]]] = {blk: [] for blk in range(b)}
        self.pending: list[tuple[int, int, int]] = []
        """(node, block, failed_src) deliveries waiting for another holder."""

    def _orders(self) -> dict[int, MulticastOp]:
        recv: dict[int, list[tuple[int, int, int]]] = {v: [] for v in range(self.plan.num_nodes)}
        for step, transfers in enumerate(self.plan.steps, start=1):
            for tr in transfers:
                recv[tr.dst].append((step, tr.block, self.agents[tr.src]))
        return {
            self.agents[v]: MulticastOp(
                mc_id=self.mc_id,
                model=self.model,
                recv=tuple(recv[v]),
                tier=self.tier,
                wait_s=self.timeout_s,
            )
            for v in range(self.plan.num_nodes)
        }

    def _alive(self, v: int) -> bool:
        return self.agents[v] not in self.client.down

    def _done(self) -> bool:
        b = self.plan.num_blocks
        return all(len(self.holds[v]) == b for v in range(self.plan.num_nodes) if self._alive(v))

    async def _assign_pending(self) -> None:
        still = []
        for node, block, bad_src in self.pending:
            if not self._alive(node) or block in self.holds[node]:
                continue
            alive = [self._alive(v) for v in range(self.plan.num_nodes)]
            src = replan_source(node, block, bad_src, self.holds, alive, self.plan.num_sources)
            if src is None:  # no live holder yet: wait for one
                still.append((node, block, bad_src))
                continue
            self.replans.append({"node": node, "block": block, "from": src, "instead_of": bad_src})
            log.info("re-plan: node %d pulls block %d from %d (not %d)", node, block, src, bad_src)
            try:
                await self.client.call(
                    self.agents[node],
                    PullFromOp(
                        mc_id=self.mc_id,
                        model=self.model,
                        block=block,
                        src=self.agents[src],
                        tier=self.tier,
                        wait_s=self.timeout_s,
                    ),
                )
            except Exception as e:  # the receiver died meanwhile: its events will say so
                log.info("re-plan to node %d failed: %s", node, e)
        self.pending = still

    async def _launch(self) -> None:
        """Start the agents' parts: each live node's receive list of the plan."""
        await asyncio.gather(
            *(
                self.client.call(a, op)
                for a, op in self._orders().items()
                if a not in self.client.down
            )
        )

    def _failed_source(self, ev: PullFailed) -> int:
        """The plan node a failed pull names as its bad source (not asked again for it)."""
        return self.node_of.get(ev.src, -1)

    async def run(self) -> MulticastResult:
        self.replans: list[dict[str, Any]] = []
        n, b = self.plan.num_nodes, self.plan.num_blocks
        arrival: list[list[float | None]] = [
            [0.0 if v < self.plan.num_sources else None for _ in range(b)] for v in range(n)
        ]
        order: list[list[int]] = [[] for _ in range(n)]
        events: list[Event] = []
        corrupt = 0
        events_q = self.client.subscribe(
            (BlockArrived, PullFailed, BlockCorrupt, AgentDown), model=self.model
        )
        start = time.time()
        await self._launch()
        deadline = time.monotonic() + self.timeout_s
        complete: float | None = None
        while not self._done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    ev = await events_q.get()
            except TimeoutError:
                break
            v = self.node_of.get(ev.node)
            if v is None:
                continue
            if isinstance(ev, AgentDown):
                events.append(ev)
                log.warning("node %d (agent %d) went down during the multicast", v, ev.node)
                await self._assign_pending()
                continue
            if getattr(ev, "mc_id", None) != self.mc_id:
                continue
            events.append(ev)
            if isinstance(ev, BlockArrived):
                if ev.block not in self.holds[v]:
                    self.holds[v].add(ev.block)
                    arrival[v][ev.block] = max(0.0, ev.t - start)
                    order[v].append(ev.block)
                await self._assign_pending()
            elif isinstance(ev, PullFailed):
                self.pending.append((v, ev.block, self._failed_source(ev)))
                await self._assign_pending()
            elif isinstance(ev, BlockCorrupt):
                corrupt += 1
        self.client.unsubscribe(events_q)
        if self._done():
            complete = max((t for row in arrival for t in row if t is not None), default=0.0)
        dead = sorted(v for v in range(n) if not self._alive(v))
        first = None
        if all(t is not None for row in arrival for t in row):
            every = cast(list[list[float]], arrival)  # no None left: checked just above
            first = first_capacity_s(every, self.pipelines, self.plan.num_sources)
        return MulticastResult(
            plan=self.plan,
            arrival_s=arrival,
            arrival_order=order,
            complete_s=complete,
            first_pipeline_s=first,
            dead_nodes=dead,
            replans=self.replans,
            corrupt_refetches=corrupt,
            events=events,
        )
