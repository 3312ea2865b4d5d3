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
    """Held by a step of this stage and by what reads or rewrites its cache (a K/V export,
    a refactoring): never two at once."""
    compute_group: str | None = None
    """`StageOpenOp.compute_group` (reported in `status`)."""
    group_lock: asyncio.Lock | None = None
    """The lock the stages of its `compute_group` share (one step at a time across them,
    BlitzScale Fig. 12b); held by its steps only: an export of this stage's K/V does not
    wait for another stage's step (each stage has its own runner and cache)."""
