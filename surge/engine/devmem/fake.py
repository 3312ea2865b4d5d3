"""A fake GPU for tests on machines without one: the device seam's copies and events are
recorded, and when a copy completes is up to the test.

It computes on the CPU (`device` is cpu) but never adopts a host buffer: every block is
copied into an arena, and the bytes are written only when the copy *completes* — so a
block used before its event would compute on zeros and change the tokens. Copies complete
in issue order (one copy stream), by a copy-engine thread:
- gated (`FakeMemory(gated=True)`): only as the test releases them (`release`, `release_all`);
- otherwise as soon as issued, or after `num_bytes / copy_gbps` when a link rate is given.
Arenas are files in /dev/shm, so an IPC handle (the file's path) opened by another process
maps the very same memory: the agents of a host group really share one copy. Selected by
the engine device `fake` (auto-completing) or passed in by a test (`ModelRunner(memory=)`,
`NodeAgent(memory=)`).
"""

import itertools
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from surge.engine.devmem.base import DeviceCopy, IpcHandle, address_of, host_bytes
from surge.errors import SurgeError

ARENA_DIR = Path("/dev/shm")
ARENA_PREFIX = "surge_fakedev_"
"""Arena files are named ARENA_PREFIX<pid>_<n> (a test checks none outlives its agents)."""


@dataclass(frozen=True)
class CopyRecord:
    """One copy the fake device was asked for."""

    seq: int
    """Issue order (0, 1, ...)."""
    kind: str
    """`h2d` (host to device) or `d2d` (from another device's arena, the NVLink copy)."""
    num_bytes: int
    pinned: bool
    """Its host source was registered (`register_host`) or allocated pinned (`host_buffer`)."""
    issued_s: float
    """time.monotonic() at issue."""


class FakeEvent:
    """`CopyEvent` of the fake device."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def query(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()

    def set(self) -> None:
        self._done.set()

    @staticmethod
    def done() -> "FakeEvent":
        """An event that has completed (an opened handle on the same device: no copy)."""
        event = FakeEvent()
        event.set()
        return event


@dataclass(frozen=True)
class _Job:
    record: CopyRecord
    src: torch.Tensor
    dst: torch.Tensor
    event: FakeEvent


class FakeMemory:
    """`DeviceMemory` of a recorded, test-controlled fake GPU."""

    shares_host_memory = False
    can_share = True

    def __init__(
        self, device_index: int = 0, gated: bool = False, copy_gbps: float | None = None
    ) -> None:
        self.device = torch.device("cpu")
        self.device_index = device_index
        self.copy_gbps = copy_gbps
        self.copies: list[CopyRecord] = []
        """Every copy issued, in issue order."""
        self.done_s: dict[int, float] = {}
        """Copy seq -> time.monotonic() when it completed."""
        self.registered: dict[int, int] = {}
        """Host address -> bytes of every registered (pinned) range."""
        self.registrations = 0
        """`register_host` calls that pinned something (a second call on a buffer does not)."""
        self.opened: list[IpcHandle] = []
        """Handles this process opened (shared copies it did not make)."""
        self._gate: int | None = 0 if gated else None
        """Copies the test has let complete but not yet completed (None: not gated)."""
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._names = itertools.count()
        self._arenas: dict[int, Path] = {}
        """Address -> file of every arena alive (what `export_ipc` names)."""
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---- what the test controls ----------------------------------------------------

    def release(self, num_copies: int = 1) -> None:
        """Let the next `num_copies` copies complete (gated)."""
        with self._cond:
            self._gate = (self._gate or 0) + num_copies
            self._cond.notify_all()

    def release_all(self) -> None:
        """Stop gating: every copy, pending or later, completes."""
        with self._cond:
            self._gate = None
            self._cond.notify_all()

    def pending(self) -> int:
        """Copies issued and not completed."""
        with self._cond:
            return len(self._queue)

    # ---- DeviceMemory ------------------------------------------------------------------

    def register_host(self, buf: memoryview) -> None:
        addr, n = address_of(buf)
        if n and addr not in self.registered:
            self.registered[addr] = n
            self.registrations += 1

    def unregister_host(self, buf: memoryview) -> None:
        self._drain()
        self.registered.pop(address_of(buf)[0], None)

    def host_buffer(self, num_bytes: int) -> memoryview:
        buf = memoryview(bytearray(num_bytes))
        self.register_host(buf)
        return buf

    def arena(self, num_bytes: int) -> torch.Tensor:
        if num_bytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        path = ARENA_DIR / f"{ARENA_PREFIX}{os.getpid()}_{id(self):x}_{next(self._names)}"
        data = torch.from_file(str(path), shared=True, size=num_bytes, dtype=torch.uint8)
        self._arenas[data.data_ptr()] = path
        weakref.finalize(data, self._forget, data.data_ptr(), path)
        return data

    def copy_in(self, buf: memoryview, arena: torch.Tensor) -> FakeEvent:
        view = memoryview(buf).cast("B")
        addr, n = address_of(view)
        pinned = any(a <= addr and addr + n <= a + size for a, size in self.registered.items())
        return self._issue("h2d", host_bytes(view) if n else arena[:0], arena, pinned)

    def export_ipc(self, data: torch.Tensor) -> IpcHandle:
        path = self._arenas.get(data.data_ptr())
        if path is None:
            raise SurgeError("the fake device can only export an arena it allocated")
        return IpcHandle(
            kind="fake",
            device_index=self.device_index,
            num_bytes=data.numel(),
            handle_hex=str(path).encode().hex(),
        )

    def open_ipc(self, handle: IpcHandle) -> DeviceCopy:
        if handle.kind != "fake":
            raise SurgeError(f"the fake device cannot open a {handle.kind} IPC handle")
        path = Path(bytes.fromhex(handle.handle_hex).decode())
        if path.parent != ARENA_DIR or not path.name.startswith(ARENA_PREFIX):
            raise SurgeError(f"fake IPC handle names {path}, not a fake device arena")
        if not path.is_file():
            raise SurgeError(f"the shared device copy {path.name} is gone (its owner evicted it)")
        shared = torch.from_file(str(path), shared=True, size=handle.num_bytes, dtype=torch.uint8)
        self.opened.append(handle)
        if handle.device_index == self.device_index:
            return DeviceCopy(shared, FakeEvent.done())
        arena = self.arena(handle.num_bytes)  # another GPU of the machine: one NVLink copy
        return DeviceCopy(arena, self._issue("d2d", shared, arena, pinned=False))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for job in left:  # shutting down: nobody may wait forever (the bytes never came)
            job.event.set()
        for addr, path in list(self._arenas.items()):
            self._forget(addr, path)

    # ---- the copy engine -----------------------------------------------------------------

    def _issue(self, kind: str, src: torch.Tensor, dst: torch.Tensor, pinned: bool) -> FakeEvent:
        record = CopyRecord(next(self._seq), kind, src.numel(), pinned, time.monotonic())
        event = FakeEvent()
        with self._cond:
            if self._closed:
                raise SurgeError("the fake device is closed")
            self.copies.append(record)
            self._queue.append(_Job(record, src, dst, event))
            if self._thread is None:
                self._thread = threading.Thread(target=self._engine, name="fake-copy", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return event

    def _engine(self) -> None:
        """Complete copies in issue order, as the gate allows, at the modelled link rate."""
        while True:
            with self._cond:
                while not self._closed and not (self._queue and self._gate != 0):
                    self._cond.wait()
                if self._closed:
                    return
                job = self._queue[0]
                if self._gate is not None:
                    self._gate -= 1
            if self.copy_gbps:
                time.sleep(job.record.num_bytes / (self.copy_gbps * 1e9))
            job.dst.copy_(job.src)
            with self._cond:
                if self._closed:
                    return
                self._queue.popleft()
                self.done_s[job.record.seq] = time.monotonic()
                self._cond.notify_all()
            job.event.set()

    def _drain(self) -> None:
        """Wait until every issued copy completed (before a source is unpinned)."""
        with self._cond:
            while self._queue and not self._closed:
                self._cond.wait(0.1)

    def _forget(self, addr: int, path: Path) -> None:
        if self._arenas.get(addr) == path:
            del self._arenas[addr]
        path.unlink(missing_ok=True)
