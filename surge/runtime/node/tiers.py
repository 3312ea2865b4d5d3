"""Where a node keeps copies of blocks: `host` (shared memory), `disk` (a local directory),
and the `remote` registry (a store directory read through a bandwidth cap, like S3 or a
model hub). The `gpu` tier is the engine's runner, owned by the agent.

Host buffers are POSIX shared-memory segments owned by the agent process, so they outlive
any runner; on the CPU a block received into one is the very memory the runner's tensors
view. Where the engine's device copies (CUDA), each segment is registered with it as pinned
once (`HostCache.pin`), so a warm start copies from it at the link's speed.
"""

import hashlib
import logging
import shutil
import threading
from multiprocessing import shared_memory
from pathlib import Path
from typing import Protocol

from surge.errors import SurgeError
from surge.model.manifest import BlockInfo, Manifest, verify_block
from surge.runtime.token_bucket import TokenBucket

log = logging.getLogger(__name__)

TIERS = ("gpu", "host", "disk", "remote")
READ_CHUNK_BYTES = 1 << 20


def segment_name(cluster_id: str, node: int, model: str, block: int) -> str:
    """Shared-memory name of one host block (short: POSIX names are limited)."""
    digest = hashlib.blake2b(model.encode(), digest_size=4).hexdigest()
    return f"surge_{cluster_id}_{node}_{digest}_{block}"


VERSION_FILE = ".version"
"""In a model's disk-tier directory: the digest of the version its block files are."""

SHM_DIR = Path("/dev/shm")
"""Where POSIX shared memory lives (a tmpfs): a write past its free space is a SIGBUS in the
writer, so room is checked before a host copy starts."""


def check_shm_room(model: str, infos: list[BlockInfo], free_bytes: int | None = None) -> None:
    """Raise `SurgeError` unless shared memory (`free_bytes`, default what /dev/shm has free)
    has room for these blocks of `model`."""
    shm_dir = SHM_DIR
    need = sum(max(1, i.size_bytes) for i in infos)
    if not need or (free_bytes is None and not shm_dir.is_dir()):
        return
    free = shutil.disk_usage(shm_dir).free if free_bytes is None else free_bytes
    if need > free:
        raise SurgeError(
            f"no room in shared memory for a host copy of {model}: it needs "
            f"{need / 1e6:.1f} MB and {shm_dir} has {free / 1e6:.1f} MB free (enlarge "
            f"{shm_dir}, free it, or lower host_cache_gb)"
        )


class LoadAborted(SurgeError):
    """A read stopped because its model was dropped from the node (`drop_model`)."""


class Pinner(Protocol):
    """What pins host memory for the device (`surge.engine.devmem.DeviceMemory`)."""

    def register_host(self, buf: memoryview) -> None: ...

    def unregister_host(self, buf: memoryview) -> None: ...


class HostCache:
    """Block buffers in shared memory, keyed by (model, block)."""

    def __init__(self, cluster_id: str, node: int) -> None:
        self.cluster_id = cluster_id
        self.node = node
        self.pinner: Pinner | None = None
        """The device that pins segments (set once the engine's device is known)."""
        self._pinned: set[tuple[str, int]] = set()
        self._segments: dict[tuple[str, int], shared_memory.SharedMemory] = {}
        self._closing: list[shared_memory.SharedMemory] = []
        """Evicted segments a view still pins (the runner's tensors, a send in flight, a
        slice not yet collected): unlinked already, closed once the last view is gone."""

    def allocate(self, model: str, info: BlockInfo) -> memoryview:
        """A writable buffer for a block (reused if present)."""
        key = (model, info.index)
        if key not in self._segments:
            name = segment_name(self.cluster_id, self.node, model, info.index)
            try:
                seg = shared_memory.SharedMemory(
                    name=name, create=True, size=max(1, info.size_bytes)
                )
            except FileExistsError:  # left by an earlier run of this node: take it over
                old = shared_memory.SharedMemory(name=name)
                old.close()
                old.unlink()
                seg = shared_memory.SharedMemory(
                    name=name, create=True, size=max(1, info.size_bytes)
                )
            self._segments[key] = seg
        return self._segments[key].buf[: info.size_bytes]

    def set_pinner(self, pinner: Pinner) -> None:
        """Pin with `pinner` from now on, and pin what is held already (blocking: run it
        off the event loop)."""
        self.pinner = pinner
        for model, block in list(self._segments):
            self.pin(model, block)

    def pin(self, model: str, block: int) -> None:
        """Register a held block's segment as pinned, once (blocking: page-locking a large
        segment takes a while; run it off the event loop)."""
        seg = self._segments.get((model, block))
        if seg is None or self.pinner is None or (model, block) in self._pinned:
            return
        self.pinner.register_host(seg.buf)
        self._pinned.add((model, block))

    def get(self, model: str, block: int) -> memoryview | None:
        seg = self._segments.get((model, block))
        return None if seg is None else seg.buf

    def blocks(self, model: str) -> list[int]:
        return sorted(b for m, b in self._segments if m == model)

    def evict(self, model: str, block: int) -> None:
        """Forget a block: its name goes now, its memory when nothing views it any more
        (closing a segment a view still exports raises BufferError, so that one waits)."""
        self._closing = [seg for seg in self._closing if not _closed(seg)]
        seg = self._segments.pop((model, block), None)
        if seg is not None:
            if (model, block) in self._pinned and self.pinner is not None:
                self._pinned.discard((model, block))
                self.pinner.unregister_host(seg.buf)
            seg.unlink()
            if not _closed(seg):
                self._closing.append(seg)

    def close(self) -> None:
        for key in list(self._segments):
            self.evict(*key)
        if self._closing:
            log.info("%d evicted host blocks still viewed at close", len(self._closing))


def _closed(seg: shared_memory.SharedMemory) -> bool:
    """Close a segment's mapping unless a view of it is still alive."""
    try:
        seg.close()
    except BufferError:
        return False
    return True


class DiskTier:
    """A local directory of block files, one sub-directory per model."""

    def __init__(self, root: Path, bucket: TokenBucket | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        """Paces reads (the node's SSD rate; None: as fast as the file system)."""
        self._versions: dict[str, str] = {}
        """Per model, the version (`Manifest.digest`) it is registered at (`claim`)."""

    def path(self, model: str, info: BlockInfo) -> Path:
        return self.root / model / info.file

    def has(self, model: str, info: BlockInfo) -> bool:
        p = self.path(model, info)
        return p.is_file() and p.stat().st_size == info.size_bytes

    def write(self, model: str, info: BlockInfo, buf: memoryview | bytearray) -> None:
        p = self.path(model, info)
        p.parent.mkdir(parents=True, exist_ok=True)
        mark = p.parent / VERSION_FILE
        if model in self._versions and not mark.exists():
            mark.write_text(self._versions[model] + "\n")
        tmp = p.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(buf)
        tmp.rename(p)

    def read_into(
        self,
        model: str,
        info: BlockInfo,
        out: memoryview,
        stop: threading.Event | None = None,
        charge: float = 1.0,
    ) -> None:
        _read_file_into(self.path(model, info), info, out, self.bucket, stop=stop, charge=charge)

    def blocks(self, model: str, manifest: Manifest) -> list[int]:
        return [b.index for b in manifest.blocks if self.has(model, b)]

    def evict(self, model: str, info: BlockInfo) -> None:
        self.path(model, info).unlink(missing_ok=True)

    def claim(self, model: str, digest: str) -> None:
        """The model's directory holds version `digest` from now on (recorded with its
        first block): files of another version, or of an unknown one (no record), left by an
        earlier run of this node go first. Block files are named by index, so two versions'
        blocks would otherwise pass for each other (`has` checks sizes only)."""
        self._versions[model] = digest
        try:
            held = (self.root / model / VERSION_FILE).read_text().strip()
        except OSError:
            held = None
        if held != digest and (self.root / model).exists():
            log.warning("disk tier: %s held another version (%s): its files removed",
                        model, held or "unknown")  # fmt: skip
            self.drop(model)

    def drop(self, model: str) -> None:
        """Remove the model's directory: its blocks and any half-written one."""
        shutil.rmtree(self.root / model, ignore_errors=True)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class RemoteRegistry:
    """The model registry: a directory of stores (`ROOT/<model>/manifest.json`), read
    through a bandwidth cap so it behaves like object storage."""

    def __init__(self, root: Path, bucket: TokenBucket) -> None:
        self.root = Path(root)
        self.bucket = bucket

    def store_dir(self, model: str) -> Path:
        return self.root / model

    def read_into(
        self,
        model: str,
        info: BlockInfo,
        out: memoryview,
        nic: TokenBucket | None = None,
        stop: threading.Event | None = None,
        charge: float = 1.0,
    ) -> None:
        """Read a block; with `nic`, each chunk also crosses that NIC cap as background
        traffic (ParaServe §4.2: inference packets first)."""
        path = self.store_dir(model) / info.file
        _read_file_into(path, info, out, self.bucket, nic, stop, charge)


def _read_file_into(
    path: Path,
    info: BlockInfo,
    out: memoryview,
    bucket: TokenBucket | None,
    nic: TokenBucket | None = None,
    stop: threading.Event | None = None,
    charge: float = 1.0,
) -> None:
    """Read a block file into `out` chunk by chunk (paced, each byte costing `charge`: the
    emulation's `ModelState.charge`), then check its checksum; once `stop` is set (the model
    was dropped) the read gives up at its next chunk."""
    if not path.is_file():
        raise SurgeError(f"block {info.index} is not at {path}")
    view = memoryview(out).cast("B")
    got = 0
    with open(path, "rb") as f:
        while got < info.size_bytes:
            n = f.readinto(view[got : got + READ_CHUNK_BYTES])
            if not n:
                break
            if bucket is not None:
                bucket.consume_blocking(round(n * charge), stop=stop)
            if nic is not None:
                nic.consume_blocking(round(n * charge), background=True, stop=stop)
            if stop is not None and stop.is_set():
                raise LoadAborted(f"the read of {path} stopped: its model was dropped")
            got += n
    if got != info.size_bytes:
        raise SurgeError(
            f"block {info.index} at {path} is truncated ({got} of {info.size_bytes} bytes)"
        )
    verify_block(info, view)
