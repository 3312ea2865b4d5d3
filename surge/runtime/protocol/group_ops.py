"""The agent op and event of a collective broadcast: the NCCL baseline's gloo group.

What flows: `group_broadcast` (controller -> each member of one scale-out's group: the root,
rank 0, first; it binds the group's rendezvous on its own address and answers where; then
every target with that address) and, from each member once its part is over and the group
is destroyed, `group_done` (its measured set-up and broadcast times, or why it failed).
The blocks themselves travel as raw tensors in torch's own gloo collective, never in these
frames. Same conventions as `protocol/ops.py`; import from `protocol`. Owned by the
runtime (`runtime/node/collective.py` carries it out, `runtime/collective.py` drives it).
"""

from dataclasses import dataclass

from surge.json_codec import require
from surge.policy.multicast.group_block_bound import GroupAlgorithm
from surge.runtime.protocol.events import Event
from surge.runtime.protocol.ops import LandingTier, Op
from surge.runtime.protocol.replies import Reply

GROUP_INIT_TIMEOUT_S = 60.0
"""How long a member waits for the whole group to form (the rendezvous and gloo's full mesh
of connections) before it gives up: a member that never joins ends the attempt, not hangs it."""


@dataclass(frozen=True)
class GroupReply(Reply):
    """Where the group's rendezvous listens (the root's answer; a target's echoes it)."""

    store_host: str
    store_port: int
    digest: str = ""
    """The root's version of the model (`Manifest.digest`), which targets are given."""


@dataclass(frozen=True)
class GroupBroadcastOp(Op[GroupReply], name="group_broadcast", reply=GroupReply):
    """Join `mc_id`'s gloo group as `rank` of `world_size` and move `blocks` from rank 0 in
    order (`algorithm`: one broadcast collective per block, or the ring's send/recv). Rank 0
    (the source: holds every block) binds the rendezvous on its own address and leaves
    `store_host` empty; a target connects to the root's `store_host:store_port` and receives
    each block into its `tier`'s buffer, checks it against the manifest and announces it
    (`arrival` with this `mc_id`, `src` = `root`). `timeout_s` bounds each block's move,
    `init_timeout_s` the group's forming. A block it could not receive is reported as a
    `pull_failed` (another holder is named then)."""

    mc_id: str
    model: str
    rank: int
    world_size: int
    root: int
    """The root's node id (what `src` of each arrival names)."""
    blocks: tuple[int, ...]
    store_host: str = ""
    store_port: int = 0
    tier: LandingTier = "gpu"
    algorithm: GroupAlgorithm = "broadcast"
    timeout_s: float = 120.0
    init_timeout_s: float = GROUP_INIT_TIMEOUT_S
    digest: str = ""
    """For a target: the root's version of the model (its `GroupReply.digest`); a target
    holding another version refuses, and the blocks are pulled instead ("": any)."""
    setup_floor_s: float = 0.0
    """Real seconds this member's group set-up lasts at least, from its op to its first
    block (under GPU-time emulation: the emulated communicator's creation x D; 0: as
    formed)."""

    def __post_init__(self) -> None:
        where = "op group_broadcast"
        require(self.setup_floor_s >= 0, where, "setup_floor_s must be >= 0")
        require(self.world_size >= 2, where, f"world_size must be >= 2 (got {self.world_size})")
        require(0 <= self.rank < self.world_size, where, f"rank {self.rank} not in the group")
        require(bool(self.blocks) and min(self.blocks) >= 0, where, "needs blocks >= 0")
        require(self.timeout_s > 0 and self.init_timeout_s > 0, where, "timeouts must be > 0")
        require(self.algorithm in ("broadcast", "ring"), where, "algorithm: broadcast or ring")
        require(
            self.rank == 0 or (bool(self.store_host) and self.store_port > 0),
            where,
            "a target needs the root's store_host and store_port",
        )


@dataclass(frozen=True, kw_only=True)
class GroupDone(Event, name="group_done"):
    """A member's part of a group broadcast is over and its group destroyed: when its group
    was ready to move blocks (`ready_t`, wall clock: formed, and the op's `setup_floor_s`
    passed), how long forming took it from the op (`setup_s`, real work only), how
    long its broadcasts took (`broadcast_s`), the bytes it received (or, on the root, put
    in), and `error` (empty when every block went through)."""

    mc_id: str
    model: str
    rank: int
    ready_t: float | None
    setup_s: float | None
    broadcast_s: float | None
    num_bytes: int
    error: str = ""
