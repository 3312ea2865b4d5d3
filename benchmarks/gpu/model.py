"""The 7B-shaped store made on the machine, and the warm start from it.

What flows: a shape in (`SHAPES`: Llama-2-7B, or a small one for `--device cpu`); a random
checkpoint and its block store out (`make_store`: the benchmarks' `registry_model`, model
`m` of `work/reg`); then the warm start (every block in registered shared memory, as the
host tier holds it, to the first token), whose engine `benchmarks/gpu/speed.py` times.
"""

import time
from pathlib import Path

import torch

from benchmarks.common import registry_model
from surge.config import EngineConfig
from surge.engine.devmem import DeviceMemory, move_block
from surge.engine.llm_engine import LLMEngine, LocalExecutor
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams
from surge.model.manifest import Manifest
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.node.tiers import HostCache, check_shm_room

SHAPES = {
    "llama-2-7b": TinyModelConfig(
        num_layers=32,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        max_position_embeddings=4096,
        dtype="bfloat16",
    ),
    "small": TinyModelConfig(
        num_layers=4,
        hidden_size=256,
        num_heads=4,
        num_kv_heads=4,
        intermediate_size=688,
        vocab_size=2048,
        dtype="float32",  # the CPU's bf16 matmuls are slow: this run only proves the script
    ),
}
PROMPT = [1, 450, 1996, 1354, 1701, 432, 1204, 975, 278, 1366, 1203, 1889, 13, 11, 29, 37]
"""16 token ids every shape's vocabulary has."""


def make_store(shape: str, work: Path, num_blocks: int) -> tuple[Path, Manifest, float]:
    """A random checkpoint of `shape` (`work/hf`) and its store (`work/reg/m`); seconds."""
    t0 = time.perf_counter()
    blocks = min(num_blocks, SHAPES[shape].num_layers)
    manifest = registry_model(work, SHAPES[shape], blocks)
    return work / "hf", manifest, time.perf_counter() - t0


def engine_config(device: str, max_kv_tokens: int) -> EngineConfig:
    return EngineConfig(device=device, max_kv_tokens=max_kv_tokens, max_num_seqs=16)


def warm_start(
    memory: DeviceMemory, manifest: Manifest, config: EngineConfig
) -> tuple[LLMEngine, dict[str, float]]:
    """Every block in registered shared memory (the host tier), then timed: one copy per
    block on the copy stream, each taken in at its event, and one prefill to the first token."""
    check_shm_room("the 7B-shaped store", list(manifest.blocks))  # not a SIGBUS midway
    host = HostCache("gpucheck", 0)
    try:
        host.set_pinner(memory)
        for info in manifest.blocks:
            buf = host.allocate("m", info)
            with open(manifest.block_path(info.index), "rb") as f:
                f.readinto(buf)
            host.pin("m", info.index)
        del buf
        sync(memory)
        t0 = time.perf_counter()
        runner = ModelRunner(manifest, config, memory=memory)
        sources = [host.get("m", i.index)[: i.size_bytes] for i in manifest.blocks]
        copies = [move_block(memory, src, adopt=False) for src in sources]
        for info, copy in zip(manifest.blocks, copies, strict=True):
            copy.event.wait()
            runner.install_block(info.index, copy.data)
        copied_s = time.perf_counter() - t0
        engine = LLMEngine(manifest, config, LocalExecutor(runner))
        engine.add_request(PROMPT, SamplingParams(max_tokens=1, ignore_eos=True))
        engine.step()
        sync(memory)
        first_token_s = time.perf_counter() - t0
        del sources, copies
    finally:
        host.close()
    return engine, {
        "bytes": manifest.total_bytes,
        "copied_s": copied_s,
        "copy_gbps": manifest.total_bytes / copied_s / 1e9,
        "first_token_s": first_token_s,
    }


def sync(memory: DeviceMemory) -> None:
    if memory.device.type == "cuda":
        torch.cuda.synchronize(memory.device)
