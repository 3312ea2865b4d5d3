"""A pinned host copy that keeps failing (shared memory full) is reported once and retried
with backoff (issue 36: ~20 WARNING lines a second, 3,692 in 2 minutes)."""

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

from surge.control.copies import Copies
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.policy.copies.host_copies import host_copy_retry_s
from surge.policy.systems import serve_system
from surge.runtime.protocol import LoadOp
from surge.runtime.transport import RemoteError


class FullShm:
    """An agent whose shared memory is full: every host load is refused."""

    def __init__(self) -> None:
        self.loads = 0
        self.down: set[int] = set()

    async def call(self, node, op):
        if isinstance(op, LoadOp):
            self.loads += 1
            raise RemoteError("load: no room in shared memory for a host copy of m")
        return None


def _deployment() -> SimpleNamespace:
    dep = SimpleNamespace(
        name="m",
        manifest=SimpleNamespace(total_bytes=4 << 20, num_blocks=2),
        restoring=False,
        num_scale_outs=0,
        pinned_nodes=set(),
        # lambdascale keeps a pinned host copy (`pinned-lru`)
        spec=SimpleNamespace(strategy="lambdascale", system=serve_system("lambdascale")),
        host_last_used_s={},
        instances={},
        failure=None,
    )
    dep.spawn = lambda coro: asyncio.get_running_loop().create_task(coro)
    return dep


def test_backoff_doubles_to_a_minute() -> None:
    assert [host_copy_retry_s(n) for n in (0, 1, 2, 3, 7, 8, 30)] == [0, 1, 2, 4, 60, 60, 60]


def test_a_failing_host_copy_is_reported_once_and_retried_with_backoff(
    tmp_path: Path, caplog
) -> None:
    client = FullShm()
    dep = _deployment()
    copies = Copies(client, ParameterPool(), {"m": dep}, ControllerConfig(state_dir=tmp_path),
                    lambda: [0, 1], 0.0)  # type: ignore[arg-type]  # fmt: skip

    async def ticks(seconds: float) -> None:  # what the autoscaler does every 0.1-s tick
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            if not dep.restoring and not copies.invariant_holds(dep):
                await copies.restore_invariant(dep)
            await asyncio.sleep(0.1)

    with caplog.at_level(logging.DEBUG, logger="surge.control.copies"):
        asyncio.run(ticks(3.5))
    # Tries at 0 s, 1 s and 3 s (waits 1, 2, 4): not one per tick (35).
    assert 2 <= client.loads <= 4, client.loads
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no room in shared memory" in warnings[0].getMessage()
