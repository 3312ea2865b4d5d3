"""A full local instance of a model on this node, as the agent keeps it: its engine, the
controller's request ids, the inbox of changes its loop applies between steps, its P/D role
and the requests parked after their prefill. Made by `instances.py`, driven by
`instance_loop.py`; P/D's parking (`pd.py`) reads and writes it. Owned by the agent (runtime/node/).
"""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from surge.runtime.protocol import HandoffReply

if TYPE_CHECKING:
    from surge.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class Parked:
    """A request parked on a prefill instance after its prefill."""

    reply: HandoffReply
    payload: bytes


@dataclass
class LocalInstance:
    """A full copy of a model on this node, serving requests with continuous batching."""

    name: str
    model: str
    engine: "LLMEngine"
    requests: dict[int, str] = field(default_factory=dict)
    """seq_id -> the controller's request id."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    inbox: list[tuple[Callable[["LLMEngine"], Any], asyncio.Future]] = field(default_factory=list)
    """Changes to the engine, applied by its loop between steps (never during one)."""
    role: str = "decode"
    """P/D role (`runtime/node/pd.py`): "prefill" parks requests after their prefill."""
    fresh: set[int] = field(default_factory=set)
    """Submitted sequences that have produced no token here yet (their prefill is next)."""
    parked: dict[str, "Parked"] = field(default_factory=dict)
    """req_id -> a request parked after its prefill, waiting for `instance_handoff`."""
    unadded: dict[str, None] = field(default_factory=dict)
    """req_ids submitted whose add still waits in the inbox (in order): not started."""

    def queued(self) -> list[str]:
        """The requests here that have not started, in the order they would: those in the
        engine's queue (no token, nothing cached), then those not added yet. Safe while a
        step runs (`LLMEngine.unstarted`)."""
        rids = [self.requests.get(sid) for sid in self.engine.unstarted()]
        return [r for r in rids if r is not None] + list(self.unadded)

    def take_queued(self, req_ids: set[str]) -> list[str]:
        """Take back those of `req_ids` that have not started (`queued`): they leave the
        engine (or their add is dropped); the ones taken, in `queued` order. Safe while a
        step runs: it runs none of them (BlitzScale §4 step 1 need not wait for it)."""
        # A snapshot (one C call): the step's thread parks P/D prefills out of `requests`.
        sids = [sid for sid, rid in list(self.requests.items()) if rid in req_ids]
        taken = []
        for sid in self.engine.take_waiting(sids):
            taken.append(self.requests.pop(sid))
            self.fresh.discard(sid)
        for rid in [r for r in self.unadded if r in req_ids]:
            del self.unadded[rid]  # its add, when the loop reaches it, adds nothing
            taken.append(rid)
        return taken

    async def call(self, fn: Callable[["LLMEngine"], Any]) -> Any:
        """Run `fn(engine)` between two steps and return its result."""
        fut = asyncio.get_running_loop().create_future()
        self.inbox.append((fn, fut))
        self.wake.set()
        return await fut
