"""A full local instance of a model on this node, as the agent keeps it: its engine, the
controller's request ids, the inbox of changes its loop applies between steps, its P/D role
and the requests parked after their prefill. Made and driven by `instances.py`; P/D's
parking (`pd.py`) reads and writes it. Owned by the agent (runtime/node/).
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

    async def call(self, fn: Callable[["LLMEngine"], Any]) -> Any:
        """Run `fn(engine)` between two steps and return its result."""
        fut = asyncio.get_running_loop().create_future()
        self.inbox.append((fn, fut))
        self.wake.set()
        return await fut
