"""How fast the engine runs on the check's device, each path against its alternative there.

What flows: the warm-started engine (`benchmarks/gpu/model.warm_start`) in; out: decode
ms/step at batch 1 and 8 (`decode_ms`); decode tokens/s of the engine against transformers
on the same device and in the engine's dtype, with the tokens each generates
(`engine_vs_transformers`, timed by `benchmarks/engine/throughput`'s helpers); and the decode
step through CUDA graphs against eager, on runners sharing the engine's device copy
(`graphs_vs_eager`; on the CPU the graph path is re-run eagerly: it proves the code path
runs, its times mean nothing).
"""

import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.engine.throughput import decode_tps, hf_greedy_ids, time_hf, time_surge
from benchmarks.gpu.model import PROMPT
from surge.engine.cuda_graphs import CudaGraphDecode, RerunGraphs
from surge.engine.device import decode_path
from surge.engine.llm_engine import LLMEngine, LocalExecutor
from surge.engine.runner import ModelRunner
from surge.engine.sampling import SamplingParams


def decode_ms(engine: LLMEngine, batch: int, steps: int) -> float:
    """ms per decode step with `batch` sequences running (after their prefill)."""
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    for i in range(batch):
        engine.add_request([*PROMPT[:-1], 100 + i], params)
    engine.step()  # the prefill
    engine.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    while engine.has_unfinished:
        engine.step()
    return ms


def paths(engine: LLMEngine) -> dict:
    """What the engine runs on this device (`surge.engine.device`)."""
    runner = engine.executor.runner
    cfg = runner.config
    return {
        "dtype": str(runner.dtype).removeprefix("torch."),
        "decode_path": decode_path(runner.device, cfg.cuda_graphs, cfg.compile_decode),
        "attention": "torch SDPA over the paged KV cache on the device",
    }


def engine_vs_transformers(engine: LLMEngine, hf_dir: Path, tokens: int) -> dict:
    """Decode tokens/s at batch 1 (N new tokens minus 1, `decode_tps`) of the engine and of
    transformers (same device, the engine's dtype), and each one's greedy tokens."""
    from transformers import AutoModelForCausalLM

    runner = engine.executor.runner
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=runner.dtype)
    hf = hf.to(runner.device).eval()
    load_s = time.perf_counter() - t0
    prompts = [PROMPT]
    time_surge(engine, prompts, 2), time_hf(hf, prompts, 2)  # warm both
    ours = decode_tps(lambda n: time_surge(engine, prompts, n), 1, tokens)
    theirs = decode_tps(lambda n: time_hf(hf, prompts, n), 1, tokens)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    ours_ids = engine.generate(prompts, params)[0].token_ids
    theirs_ids = hf_greedy_ids(hf, prompts, tokens)[0]
    return {
        "engine": {"decode_tokens_per_s": ours, "token_ids": ours_ids, **paths(engine)},
        "hf": {"decode_tokens_per_s": theirs, "token_ids": theirs_ids, "load_s": load_s},
    }


def twin(runner: ModelRunner, **changes) -> ModelRunner:
    """A runner over the same device bytes as `runner` (no copy), its own KV cache."""
    other = ModelRunner(
        runner.manifest, replace(runner.config, **changes), memory=runner.weights.memory
    )
    for index, data in sorted(runner.weights.block_data.items()):
        other.install_block(index, data)
    return other


def graphs_vs_eager(engine: LLMEngine, steps: int) -> dict:
    """Decode ms/step at batch 1 and 8 through CUDA graphs and eager, same weights, same
    device, and whether both generate the same 16 tokens."""
    base = engine.executor.runner
    graphed, eager = twin(base), twin(base, cuda_graphs=False)
    real = graphed.cuda_graphs is not None
    if not real:  # the CPU: the graph path's code, re-run eagerly
        graphed.cuda_graphs = CudaGraphDecode(
            graphed.decode_logits,
            graphed.kv.scratch_page,
            graphed.config.page_size_tokens,
            graphed.device,
            RerunGraphs(),
            max_batch=graphed.config.max_num_seqs,
        )
    out: dict = {"capture": "CUDA graphs" if real else "re-run on the CPU (times mean nothing)"}
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    for name, runner in (("graphs", graphed), ("eager", eager)):
        e = LLMEngine(runner.manifest, runner.config, LocalExecutor(runner))
        for b in (1, 8):
            out[f"{name}_b{b}_ms"] = decode_ms(e, b, steps)
        out[f"{name}_token_ids"] = e.generate([PROMPT], params)[0].token_ids
    for b in (1, 8):
        out[f"b{b}_eager_over_graphs"] = out[f"eager_b{b}_ms"] / out[f"graphs_b{b}_ms"]
    out["same_tokens"] = out["graphs_token_ids"] == out["eager_token_ids"]
    graphs = graphed.cuda_graphs
    assert graphs is not None
    out["buckets"] = [list(k) for k in sorted(graphs.buckets)]
    out["replays"] = graphs.replays
    del graphed, eager
    if base.device.type == "cuda":
        torch.cuda.empty_cache()
    return out
