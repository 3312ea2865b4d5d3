"""The device seam (`surge.engine.devmem`) on its fake GPU: one recorded copy per block,
bytes there only once its event completed, completion in issue order as the test releases
it, pinning once, IPC opening the very memory; and a runner fed through it gives the tokens
of the plain CPU runner."""

import threading
import time
from pathlib import Path

import pytest
import torch

from surge.config import EngineConfig
from surge.engine.devmem import IpcHandle, device_memory, move_block
from surge.engine.devmem.cpu import CpuMemory
from surge.engine.devmem.fake import ARENA_DIR, ARENA_PREFIX, FakeMemory
from surge.engine.llm_engine import LLMEngine, LocalExecutor
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.errors import SurgeError
from surge.model.blocks import read_block_file
from surge.model.manifest import Manifest, read_manifest


def wait_until(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def arena_files() -> set[Path]:
    return set(ARENA_DIR.glob(f"{ARENA_PREFIX}*"))


def test_gated_copies_complete_in_order_and_write_only_on_completion() -> None:
    fake = FakeMemory(gated=True)
    try:
        bufs = [memoryview(bytearray(bytes([i + 1]) * 4096)) for i in range(3)]
        copies = [move_block(fake, b, adopt=True) for b in bufs]  # never adopted: a GPU
        assert [c.kind for c in fake.copies] == ["h2d"] * 3
        assert [c.num_bytes for c in fake.copies] == [4096] * 3
        assert not any(c.event.query() for c in copies)
        assert all(int(c.data.sum()) == 0 for c in copies), "bytes before the event"
        fake.release(1)
        wait_until(copies[0].event.query)
        assert int(copies[0].data[0]) == 1 and bool((copies[0].data == 1).all())
        assert not copies[1].event.query() and int(copies[1].data.sum()) == 0
        assert fake.pending() == 2
        fake.release_all()
        for c in copies:
            c.event.wait()
        assert [int(c.data[-1]) for c in copies] == [1, 2, 3]
        assert sorted(fake.done_s, key=fake.done_s.get) == [0, 1, 2]
    finally:
        fake.close()


def test_pinning_is_recorded_once_and_marks_copies_pinned() -> None:
    fake = FakeMemory()
    try:
        held = memoryview(bytearray(8192))
        fake.register_host(held)
        fake.register_host(held)
        assert fake.registrations == 1
        move_block(fake, held[1024:2048], adopt=False).event.wait()  # inside a pinned range
        move_block(fake, memoryview(bytearray(64)), adopt=False).event.wait()  # pageable
        pinned_buffer = fake.host_buffer(128)
        move_block(fake, pinned_buffer, adopt=True).event.wait()
        assert [c.pinned for c in fake.copies] == [True, False, True]
        fake.unregister_host(held)
        move_block(fake, held[:64], adopt=False).event.wait()
        assert fake.copies[-1].pinned is False
    finally:
        fake.close()


def test_ipc_handle_opens_the_same_memory_and_files_go_at_close() -> None:
    before = arena_files()
    owner, mate, other_gpu = FakeMemory(), FakeMemory(), FakeMemory(device_index=1)
    try:
        copy = move_block(owner, memoryview(bytearray(b"\x07" * 1000)), adopt=True)
        copy.event.wait()
        handle = IpcHandle(**owner.export_ipc(copy.data).__dict__)  # as if off the wire
        shared = mate.open_ipc(handle)
        assert shared.event.query() and mate.copies == []  # same device: no copy at all
        copy.data[3] = 42
        assert int(shared.data[3]) == 42, "the opened handle is the owner's memory"
        peer = other_gpu.open_ipc(handle)  # another GPU of the machine: one d2d copy
        peer.event.wait()
        assert [c.kind for c in other_gpu.copies] == ["d2d"] and int(peer.data[3]) == 42
        with pytest.raises(SurgeError, match="only export an arena"):
            owner.export_ipc(torch.zeros(4, dtype=torch.uint8))
    finally:
        for m in (owner, mate, other_gpu):
            m.close()
    assert arena_files() == before
    with pytest.raises(SurgeError, match="is gone"):
        FakeMemory().open_ipc(handle)


def test_cpu_adopts_an_owned_buffer_and_copies_a_borrowed_one() -> None:
    cpu = CpuMemory()
    buf = memoryview(bytearray(b"\x05" * 256))
    adopted = move_block(cpu, buf, adopt=True)
    borrowed = move_block(cpu, buf, adopt=False)
    buf[0] = 9
    assert int(adopted.data[0]) == 9 and int(borrowed.data[0]) == 5
    with pytest.raises(SurgeError, match="cannot share"):
        cpu.export_ipc(adopted.data)
    assert isinstance(device_memory("cpu"), CpuMemory)
    assert device_memory("fake") is device_memory("fake")


def greedy(runner: ModelRunner, prompt: list[int], steps: int) -> list[int]:
    engine = LLMEngine(runner.manifest, runner.config, LocalExecutor(runner))
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    return engine.generate([prompt], params)[0].token_ids


def cpu_runner(store: Path) -> tuple[Manifest, EngineConfig, ModelRunner]:
    """The store's manifest, a small engine config, and a CPU runner holding every block."""
    manifest = read_manifest(store)
    config = EngineConfig(max_kv_tokens=256)
    cpu = ModelRunner(manifest, config, memory=CpuMemory())
    cpu.load_blocks()
    return manifest, config, cpu


def test_a_runner_fed_through_the_fake_gpu_gives_the_cpu_tokens(tiny_store: Path) -> None:
    manifest, config, cpu = cpu_runner(tiny_store)
    fake = FakeMemory(gated=True)
    try:
        gpu = ModelRunner(manifest, config, memory=fake)
        added = threading.Thread(target=gpu.load_blocks)
        added.start()
        wait_until(lambda: fake.pending() == 1)
        assert not gpu.weights.layers and gpu.weights.embedding is None, (
            "taken in before its copy completed"
        )
        fake.release_all()
        added.join(30)
        assert [c.num_bytes for c in fake.copies] == [b.size_bytes for b in manifest.blocks]
        assert set(gpu.weights.block_data) == set(range(manifest.num_blocks))
        prompt = [0, 5, 9, 200, 31]
        assert greedy(gpu, prompt, 12) == greedy(cpu, prompt, 12)
    finally:
        fake.close()


def test_a_block_not_on_the_device_changes_the_tokens(tiny_store: Path) -> None:
    """The fake writes bytes only on completion: a runner that took blocks in before their
    events computes on zeros and its tokens differ (what lets the gating tests fail)."""
    manifest, config, cpu = cpu_runner(tiny_store)
    fake = FakeMemory(gated=True)
    try:
        early = ModelRunner(manifest, config, memory=fake)
        for info in manifest.blocks:
            buf = read_block_file(manifest.block_path(info.index), info)
            early.install_block(info.index, move_block(fake, buf, True).data)  # no wait
        prompt = [0, 5, 9, 200, 31]
        assert greedy(early, prompt, 6) != greedy(cpu, prompt, 6)
    finally:
        fake.release_all()
        fake.close()
