"""Blocks landing together are taken into one runner: `DeviceTier.take_in` runs in
worker threads, and the first block creates the runner. Without a lock two threads could
each create one; the blocks added to the runner that lost were missing ("runner lacks
layers [1]" on a generate after a multicast whose dead node's dependants pulled two blocks
from other holders at once)."""

import threading
import time
from types import SimpleNamespace

import surge.engine.runner as runner_module
from surge.runtime.node.device_tier import DeviceTier
from surge.runtime.node.model_state import ModelState


class SlowRunner:
    """Takes long enough to build that two threads both find no runner."""

    def __init__(self, manifest, config, memory=None, compile_gate=None) -> None:
        time.sleep(0.05)
        self.blocks: set[int] = set()

    def install_block(self, index: int, data) -> None:
        self.blocks.add(index)


def test_blocks_landing_together_share_one_runner(monkeypatch) -> None:
    monkeypatch.setattr(runner_module, "ModelRunner", SlowRunner)
    ctx = SimpleNamespace(
        config=SimpleNamespace(engine=None, preload_engine=False), compile_gate=None
    )
    seam = SimpleNamespace(shares_host_memory=True)  # the device seam, already chosen
    device = DeviceTier(ctx, SimpleNamespace(pinner=None), seam)  # type: ignore[arg-type]
    state = ModelState(manifest=None)  # type: ignore[arg-type]
    threads = [threading.Thread(target=device.take_in, args=(state, b, b"")) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state.runner.blocks == {0, 1, 2, 3}
