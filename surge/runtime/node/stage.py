"""One stage of an execution pipeline on this node: a layer range, its runner, where its
output goes. Made by `serving.py` (stage_open), re-cut by `refactor.py` (FlexPipe's inflight
refactoring). Owned by the agent (runtime/node/).
"""

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from surge.engine.runner import ModelRunner


@dataclass
class Stage:
    """One stage of a pipeline on this node."""

    pipeline: str
    model: str
    first_layer: int
    end_layer: int
    next_node: int | None
    runner: "ModelRunner"
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    compute_group: str | None = None
    """`StageOpenOp.compute_group` (reported in `status`)."""
