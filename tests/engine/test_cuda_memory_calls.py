"""`CudaMemory` (the CUDA body of the device seam) has not run on a GPU (docs/gpu.md); this
checks the calls it makes, against a stand-in for `torch.cuda` that records them: a host
range is registered once with the portable flag and unregistered only after the copy
stream drained; a copy waits on the engine's stream (taken before switching), runs on the
copy stream, non-blocking, and records its event there; a failed registration is an error."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from surge.engine.devmem import cuda as cuda_module
from surge.engine.devmem import move_block
from surge.errors import SurgeError


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.current = "engine"
        self.register_error = "success"


class FakeStream:
    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def wait_stream(self, other) -> None:
        self.rec.calls.append(("wait_stream", self.name, getattr(other, "name", other)))

    def synchronize(self) -> None:
        self.rec.calls.append(("synchronize", self.name))


class FakeEvent:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def record(self, stream) -> None:
        self.rec.calls.append(("record", stream.name))

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.rec.calls.append(("event_sync",))


@pytest.fixture
def rec(monkeypatch) -> Recorder:
    rec = Recorder()
    rt = SimpleNamespace(
        cudaError=SimpleNamespace(success="success"),
        cudaHostRegister=lambda ptr, n, flags: (
            rec.calls.append(("register", ptr, n, flags)) or rec.register_error
        ),
        cudaHostUnregister=lambda ptr: rec.calls.append(("unregister", ptr)) or "success",
    )

    @contextlib.contextmanager
    def on_stream(stream):
        before, rec.current = rec.current, stream.name
        yield
        rec.current = before

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: FakeStream(rec, "copy"))
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: FakeStream(rec, rec.current)
    )
    monkeypatch.setattr(torch.cuda, "Event", lambda: FakeEvent(rec))
    return rec


def memory(rec: Recorder, monkeypatch) -> cuda_module.CudaMemory:
    m = cuda_module.CudaMemory(torch.device("cuda", 0))
    monkeypatch.setattr(m, "arena", lambda n: torch.empty(n, dtype=torch.uint8))  # on the CPU
    return m


def test_registers_once_portable_and_unregisters_after_the_copies(rec, monkeypatch) -> None:
    m = memory(rec, monkeypatch)
    buf = memoryview(bytearray(4096))
    m.register_host(buf)
    m.register_host(buf)
    (call,) = [c for c in rec.calls if c[0] == "register"]
    assert call[2:] == (4096, 1)  # cudaHostRegisterPortable
    m.unregister_host(buf)
    assert rec.calls[-2:] == [("synchronize", "copy"), ("unregister", call[1])]
    rec.register_error = "cudaErrorHostMemoryAlreadyRegistered"
    with pytest.raises(SurgeError, match="cudaHostRegister of 64 bytes failed"):
        m.register_host(memoryview(bytearray(64)))


def test_one_copy_on_the_copy_stream_after_the_engines_work(rec, monkeypatch) -> None:
    m = memory(rec, monkeypatch)
    copies = []
    real_copy = torch.Tensor.copy_

    def copy_(self, src, non_blocking=False):
        copies.append((rec.current, non_blocking, src.numel()))
        return real_copy(self, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    buf = memoryview(bytearray(b"\x03" * 1000))
    copy = move_block(m, buf, adopt=True)  # a GPU never adopts: it copies
    assert copies == [("copy", True, 1000)]
    assert ("wait_stream", "copy", "engine") in rec.calls
    assert rec.calls[-1] == ("record", "copy")
    copy.event.wait()
    assert int(copy.data.sum()) == 3000
