"""The autoscaler's memory across controller restarts: `STATE_DIR/autoscale.json`.

What flows: every `SAVE_EVERY_S` (the controller's loop), at a deletion and at `stop`, each
deployment's `AutoscaleState` and load become what a restart now would carry
(`policy.autoscale_restart.carry`: the historical peak, since when the pool has been quiet,
the instances it holds and since when each has been, by node); when any of that changed (a
busy pool's quiet time is now, so it changes while a pool serves) the file is written
again. At `start`, after the stored deployments are restored, each one the file names gets
its carry back as its `AutoscaleState` (`peak_instances`, `restart`): the decisions go on
as if nothing had restarted (docs/control.md, Restart); `adoption.py`'s `settle` gives each
adopted instance its own carried idle time.

The file: JSON, version `VERSION`, times as wall-clock seconds (`time.time`): the
controller's clock is monotonic (emulated seconds under GPU-time emulation) and its origin
means nothing in another process. A time goes out as now's wall time less its age, and
comes back as the new clock's now less the wall time elapsed since (in this clock's
seconds; a wall time in the future counts as now). Written to a temporary file in the same
directory, fsynced, then renamed over the old one: a crash leaves the old file or the new,
never part of one. A missing file is a first start. A version-1 file (before per-instance
times) is read with one WARNING: each instance counts as quiet since its deployment's time.
An unreadable, corrupt or other-version file is one WARNING and the deployments start with
no memory, as before this file: the deployments are in SQLite (`store.py`), which this file
never touches. A record that does not parse is skipped with a WARNING. Never pickle: the
file is data a person may read. Owned by control/; decides nothing.
"""

import asyncio
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.control.load_monitor import pool_load
from surge.control.state import Deployment
from surge.errors import SurgeError
from surge.json_codec import Message
from surge.policy.autoscale import AutoscaleState, idle_since, instances_quiet
from surge.policy.autoscale_restart import Carried, Restart, carry
from surge.runtime.clock import Clock

log = logging.getLogger(__name__)

FILE_NAME = "autoscale.json"
"""The memory's file in the state directory (next to `deployments.sqlite`)."""
VERSION = 2
"""The file's format; a file of another version is ignored with a warning, but for
`OLD_VERSION`."""
OLD_VERSION = 1
"""The format before per-instance times (`PoolRecord.instances`): read, with one warning,
each instance quiet since its deployment's time."""
SAVE_EVERY_S = 1.0
"""How often the controller takes the carry and writes it when it changed (its clock's
seconds): what a crash can lose is at most this much of a busy pool's last activity."""


@dataclass(frozen=True)
class PoolRecord(Message):
    """One deployment's carry as the file holds it."""

    peak_instances: int
    held_instances: int
    quiet_since_wall_s: float
    """Wall-clock seconds (Unix time)."""
    instances: dict[str, float] = field(default_factory=dict)
    """Node -> since when its instance has had no request (wall-clock seconds); version 2."""

    def __post_init__(self) -> None:
        times = [self.quiet_since_wall_s, *self.instances.values()]
        if not all(math.isfinite(t) for t in times):
            raise SurgeError(f"quiet times must be finite (got {times})")


@dataclass(frozen=True)
class MemoryFile(Message):
    """The whole file."""

    version: int
    written_at_wall_s: float
    """When it was written (for a person reading it)."""
    deployments: dict[str, Any]
    """Deployment name -> its `PoolRecord` (parsed one by one: a bad one is skipped)."""


class AutoscaleMemory:
    """Reads and writes the carry of every deployment (`autoscale.json`)."""

    def __init__(self, path: Path, clock: Clock, wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.clock = clock
        """The controller's clock: the states' times are its seconds."""
        self.wall = wall
        self._last: dict[str, Carried] = {}
        """What the file holds now (or will, once the write in flight ends)."""
        self._saving = asyncio.Lock()
        """Saves one at a time, in order (a deletion's save never lands before an older one)."""
        self._write_lock = threading.Lock()
        self._restored = False
        """`restore` ran: until then nothing is written (a start that failed before it must
        not replace the file with an empty carry)."""
        self._warned = False
        """A failing write is warned about once, not every second."""

    # ---- reading -----------------------------------------------------------------

    def load(self) -> dict[str, Carried]:
        """The carries the file holds, in this clock's seconds; empty (with one WARNING) if
        it cannot be read, does not parse or is of another version; empty if missing."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            return self._ignored(f"cannot be read: {e}")
        try:
            doc = json.loads(text)
            version = doc.get("version") if isinstance(doc, dict) else None
            if version not in (VERSION, OLD_VERSION):
                return self._ignored(f"is of version {version!r}, this surge reads {VERSION}")
            records = MemoryFile.from_json(doc).deployments
            if version == OLD_VERSION:
                log.warning(
                    "%s is of version %d (one idle time per deployment): each instance counts "
                    "as idle since its deployment's last request",
                    self.path,
                    OLD_VERSION,
                )
        except (ValueError, SurgeError) as e:  # json.JSONDecodeError is a ValueError
            return self._ignored(f"is not valid: {e}")
        now_s, wall_now_s = self.clock.now_s(), self.wall()
        out: dict[str, Carried] = {}
        for name, body in records.items():
            try:
                r = PoolRecord.from_json(body)

                def since(wall_s: float) -> float:
                    return now_s - self.clock.of_real(max(0.0, wall_now_s - wall_s))

                each = tuple(sorted((int(n), since(t)) for n, t in r.instances.items()))
                restart = Restart(since(r.quiet_since_wall_s), r.held_instances, each)
                out[name] = Carried(r.peak_instances, restart)
            except (SurgeError, TypeError, ValueError) as e:
                log.warning("%s: the autoscaler state of %r is ignored: %s", self.path, name, e)
        return out

    def _ignored(self, why: str) -> dict[str, Carried]:
        log.warning(
            "%s %s; it is ignored: the deployments start with no autoscaler state (no peak, "
            "no idle time)",
            self.path,
            why,
        )
        return {}

    def restore(self, deployments: dict[str, Deployment]) -> None:
        """Give each restored deployment the file names its carry back (its `AutoscaleState`:
        the peak, and the restart's quiet time and instances)."""
        carried = self.load()
        for name, dep in deployments.items():
            c = carried.get(name)
            if c is not None:
                dep.autoscale_state = AutoscaleState(
                    peak_instances=c.peak_instances, restart=c.restart
                )
                log.info(
                    "%s: autoscaler state restored (peak %d, %d instances, quiet %.1f s)",
                    name,
                    c.peak_instances,
                    c.restart.held_instances,
                    self.clock.now_s() - c.restart.quiet_since_s,
                )
        self._last = {n: c for n, c in carried.items() if n in deployments}
        self._restored = True

    # ---- writing -----------------------------------------------------------------

    def take(self, deployments: dict[str, Deployment], now_s: float) -> dict[str, Carried]:
        """What a restart now would carry of every deployment (`policy.autoscale_restart`)."""
        out: dict[str, Carried] = {}
        for name, dep in deployments.items():
            if dep.failure is not None:
                continue
            load, state = pool_load(dep, now_s), dep.autoscale_state
            busy = load.outstanding > 0
            c = carry(
                state.peak_instances, state.restart, busy, idle_since(load),
                len(load.instances), now_s, self._last.get(name), instances_quiet(load),
            )  # fmt: skip
            if c is not None:
                out[name] = c
        return out

    async def save(self, deployments: dict[str, Deployment]) -> None:
        """Write the carry if it changed since the last write (never raises: a failing write
        is one WARNING, and the next save tries again); nothing before `restore`."""
        if not self._restored:
            return
        async with self._saving:
            await self._save(deployments)

    async def _save(self, deployments: dict[str, Deployment]) -> None:
        now_s = self.clock.now_s()
        carried = self.take(deployments, now_s)
        if carried == self._last:
            return
        wall_now_s = self.wall()

        def wall(since_s: float) -> float:
            return wall_now_s - self.clock.real_s(now_s - since_s)

        records = {
            name: PoolRecord(
                c.peak_instances,
                c.restart.held_instances,
                wall(c.restart.quiet_since_s),
                {str(n): wall(t) for n, t in c.restart.instances},
            ).to_json()
            for name, c in carried.items()
        }
        doc = MemoryFile(VERSION, wall_now_s, records).to_json()
        text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
        try:
            await asyncio.to_thread(self._write, text)
        except OSError as e:
            if not self._warned:
                log.warning("cannot write the autoscaler state %s: %s", self.path, e)
            self._warned = True
            return
        self._warned = False
        self._last = carried

    def _write(self, text: str) -> None:
        """Replace the file atomically: a temporary file, fsynced, renamed over it."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with self._write_lock:
            try:
                with open(tmp, "w") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)

    async def run(self, deployments: dict[str, Deployment]) -> None:
        """Save every `SAVE_EVERY_S` until cancelled; a failing save is logged, not fatal."""
        while True:
            await self.clock.sleep(SAVE_EVERY_S)
            try:
                await self.save(deployments)
            except Exception:  # a bug must not stop the saves of every later second
                log.exception("saving the autoscaler state failed")
