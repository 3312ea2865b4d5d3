"""The NCCL baseline carried out for real: one gloo group broadcast per scale-out.

In: the same plan a block multicast gets (plan nodes 0..K-1 are sources, the rest targets;
only its node count, block count and sources are read: gloo routes the bytes itself) and the
agents. `GroupExecutor` makes a `torch.distributed` gloo process group among the first
source (rank 0, the root) and the live targets, created for this scale-out and destroyed
after it (λScale §7.2 and BlitzScale §5: NCCL's group creation is part of every scale-out's
cost; here it is measured, not assumed), and the root broadcasts every block into the
targets' tier buffers over the agents' own links (`runtime/node/collective.py`). Out: a
`MulticastResult` like a block multicast's (arrivals, completion) with the group's measured
times (`GroupTimes`).

Failures take the block multicast's path: a target that could not receive a block reports a
failed pull and is re-planned to pull it from a live holder (the root included: the group
failed, not the root) over surge's transport; a group that cannot start at all (a member
refused or unreachable) leaves the whole plan to the block pulls. Every wait is bounded:
the group's forming by `init_timeout_s` and each block's move by `block_timeout_s`: the
block's expected transfer time at the group's slowest reported link, times a generous
factor, plus a floor, never more than a share of the executor's timeout: the decision is
`policy/multicast/group_block_bound.py`'s (`GroupBlockBound`, `block_timeout_s`); this
module hands each member its bound.
"""

import asyncio
import logging
import time

from surge.errors import SurgeError
from surge.policy.multicast.group_block_bound import (
    GroupAlgorithm,
    GroupBlockBound,
    GroupLink,
    block_timeout_s,
)
from surge.runtime.multicast import GroupTimes, MulticastExecutor, MulticastResult
from surge.runtime.protocol import (
    GROUP_INIT_TIMEOUT_S,
    AgentDown,
    GroupBroadcastOp,
    GroupDone,
    PullFailed,
)
from surge.runtime.transport import ConnectionClosed, RemoteError

log = logging.getLogger(__name__)

LAUNCH_ERRORS = (SurgeError, RemoteError, ConnectionClosed, OSError)
"""What a member's `group_broadcast` call raises when it refuses or cannot be reached."""
DONE_WAIT_S = 10.0
"""How long the executor waits, after the model is in, for the members' `group_done`
reports (they follow the last arrival at once; a dead member never sends one)."""


class GroupExecutor(MulticastExecutor):
    """A `MulticastExecutor` whose bytes move in one gloo group broadcast (`algorithm`:
    gloo's broadcast collective, or NCCL's ring order over send/recv)."""

    init_timeout_s: float = GROUP_INIT_TIMEOUT_S

    def __init__(
        self,
        *args,
        algorithm: GroupAlgorithm = "broadcast",
        setup_floor_s: float = 0.0,
        link: GroupLink | None = None,
        block_bound: GroupBlockBound | None = None,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.algorithm: GroupAlgorithm = algorithm
        self.setup_floor_s = setup_floor_s
        """Real seconds each member's set-up lasts at least (`GroupBroadcastOp`)."""
        self.link = link
        """The largest block and the slowest member link (None: unknown)."""
        self.block_bound = block_bound or GroupBlockBound()
        """Each block's wait (`policy/multicast/group_block_bound.py`; None: the default)."""

    def _members(self) -> list[int]:
        """Rank order: the first source, then every live target."""
        k = self.plan.num_sources
        return [self.agents[0], *(a for a in self.agents[k:] if a not in self.client.down)]

    async def _launch(self) -> None:
        self.members = self._members()
        self.fell_back = False
        self.done_q = self.client.subscribe((GroupDone, AgentDown), model=self.model)
        self.group_start = time.time()
        blocks = tuple(range(self.plan.num_blocks))
        size = len(self.members)

        def op(rank: int, host: str = "", port: int = 0, digest: str = "") -> GroupBroadcastOp:
            return GroupBroadcastOp(
                mc_id=self.mc_id,
                model=self.model,
                rank=rank,
                world_size=len(self.members),
                root=self.members[0],
                blocks=blocks,
                store_host=host,
                store_port=port,
                tier=self.tier,
                algorithm=self.algorithm,
                timeout_s=block_timeout_s(
                    self.link, self.block_bound, self.algorithm, rank, size, self.timeout_s
                ),
                init_timeout_s=min(self.init_timeout_s, self.block_bound.cap_s(self.timeout_s)),
                setup_floor_s=self.setup_floor_s,
                digest=digest,
            )

        self.started: list[int] = []
        """Members that took their op: only these send a `group_done`."""
        refused: BaseException | None = None
        try:
            reply = await self.client.call(self.members[0], op(0))
        except LAUNCH_ERRORS as e:
            refused = e
        else:
            self.started.append(self.members[0])
            joined = await asyncio.gather(
                *(
                    self.client.call(a, op(rank, reply.store_host, reply.store_port, reply.digest))
                    for rank, a in enumerate(self.members[1:], start=1)
                ),
                return_exceptions=True,
            )
            for a, r in zip(self.members[1:], joined, strict=True):
                if not isinstance(r, BaseException):
                    self.started.append(a)
                elif isinstance(r, LAUNCH_ERRORS):
                    refused = r
                else:
                    raise r
        if refused is not None:
            # A member refused (no gloo, TLS, self-paced links) or is unreachable: those
            # that joined give up after init_timeout_s and report their blocks as failed
            # pulls, which the block pulls started here make moot.
            log.warning("gloo group %s could not start (%s): block pulls instead", self.mc_id,
                        refused)  # fmt: skip
            self.fell_back = True
            await super()._launch()

    def _failed_source(self, ev: PullFailed) -> int:
        # The group failed, not its root: the root may send the block over surge's transport.
        return -1

    async def run(self) -> MulticastResult:
        try:
            result = await super().run()
            result.group = await self._times()
        finally:
            if hasattr(self, "done_q"):
                self.client.unsubscribe(self.done_q)
        return result

    async def _times(self) -> GroupTimes:
        """The members' `group_done` reports (bounded wait), summed up."""
        got: dict[int, GroupDone] = {}
        deadline = time.monotonic() + DONE_WAIT_S
        waiting = set(self.started)
        while waiting - set(self.client.down) and (left := deadline - time.monotonic()) > 0:
            try:
                async with asyncio.timeout(left):
                    ev = await self.done_q.get()
            except TimeoutError:
                break
            if isinstance(ev, GroupDone) and ev.mc_id == self.mc_id:
                got[ev.node] = ev
                waiting.discard(ev.node)
        ready = [d.ready_t for d in got.values()]
        formed = len(got) == len(self.members) and all(t is not None for t in ready)
        spans = [d.broadcast_s for d in got.values() if d.broadcast_s is not None]
        targets = [d.num_bytes for d in got.values() if d.rank > 0]
        return GroupTimes(
            setup_s=max(t for t in ready if t is not None) - self.group_start if formed else None,
            member_setup_s=tuple(got[a].setup_s if a in got else None for a in self.members),
            broadcast_s=max(spans) if spans else None,
            num_bytes=max(targets, default=0),
            errors=tuple(f"node {d.node}: {d.error}" for d in got.values() if d.error),
            fell_back=self.fell_back,
        )
