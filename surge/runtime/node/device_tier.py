"""The gpu tier's device side of one node: the engine's device seam (`surge.engine.devmem`),
chosen on first use, and blocks copied to the device and taken into their model's runner.

What flows: a landed block's host buffer in (`to_device`, from the store's `landed`, in a
worker thread), or device bytes another process shared (`take_in`, `device_share.py`);
out, the block in `ModelState.device_blocks` and installed in the runner. One contiguous
copy on the copy stream with one event (on the CPU the received buffer itself, no copy);
the block is taken in only once that event completed. Owned by the node agent's store.
"""

import threading
from typing import Any

from surge.runtime.node.context import NodeContext
from surge.runtime.node.model_state import ModelState
from surge.runtime.node.tiers import HostCache


class DeviceTier:
    """One node's device seam and the copies of blocks onto it."""

    def __init__(self, ctx: NodeContext, host_cache: HostCache, memory: Any = None) -> None:
        self.ctx, self.host_cache = ctx, host_cache
        self.chosen = memory
        """The engine's device seam (`surge.engine.devmem.DeviceMemory`) once chosen: passed
        in (a test's fake), else by the engine's device setting on first use (`memory`)."""
        self._lock = threading.Lock()
        if memory is not None or ctx.config.preload_engine:  # torch is imported: pin as we go
            self.memory()

    def memory(self) -> Any:
        """The device seam, chosen on first use (imports torch: call it off the event loop
        unless the engine is loaded). From then on the host tier is pinned with it."""
        with self._lock:
            if self.chosen is None:
                from surge.engine.devmem import device_memory

                self.chosen = device_memory(self.ctx.config.engine.device)
            if self.host_cache.pinner is None and not self.chosen.shares_host_memory:
                self.host_cache.set_pinner(self.chosen)  # CPU: nothing to pin
            return self.chosen

    def to_device(self, state: ModelState, block: int, buf: memoryview, adopt: bool) -> None:
        """One block to the device and into the runner (a worker thread): the copy is issued
        on the copy stream and the block taken in only when its event completed, while the
        event loop receives the next block (ParaServe §5 overlap; ServerlessLLM §4)."""
        from surge.engine.devmem import move_block

        memory = self.memory()
        copy = move_block(memory, buf, adopt)
        copy.event.wait()
        self.take_in(state, block, copy.data)

    def runner(self, state: ModelState) -> Any:
        """The model's runner on this node, made on first use (imports torch: off the loop)."""
        with state.runner_lock:
            if state.runner is None:
                from surge.engine.runner import ModelRunner

                state.runner = ModelRunner(
                    state.manifest,
                    self.ctx.config.engine,
                    memory=self.memory(),
                    compile_gate=self.ctx.compile_gate,
                )
            return state.runner

    def take_in(self, state: ModelState, block: int, data: Any) -> None:
        """Take a block's arrived device bytes into the gpu tier and the model's runner."""
        self.runner(state).install_block(block, data)
        state.device_blocks[block] = data

    def close(self) -> None:
        if self.chosen is not None:
            self.chosen.close()
