"""Decode throughput of the surge engine vs transformers `generate`, same model, same run.

Writes benchmarks/results/engine/engine_throughput.json and .png. Decode tokens/s is measured as
batch * (N - 1) / (t(N new tokens) - t(1 new token)), so prefill is excluded for both; the
two engines alternate over several rounds and the median is reported, since absolute times
on a shared machine mean little. The ratio surge / transformers is the result.

Usage: python benchmarks/engine/throughput.py [--preset 100mb] [--new-tokens 64] [--rounds 3]
"""

import argparse
import json
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import preset

log = logging.getLogger("engine_throughput")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "engine"


def prompts_for(batch: int, prompt_len: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(2, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]


def time_surge(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> float:
    t = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return time.perf_counter() - t


def hf_greedy_ids(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' greedy generate of `new_tokens` per prompt (EOS ignored), on the
    model's device; the new token ids (read back: the call has finished on the device)."""
    ids = torch.tensor(prompts, device=model.device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert out.shape[1] == ids.shape[1] + new_tokens
    return out[:, ids.shape[1] :].tolist()


def time_hf(model, prompts: list[list[int]], new_tokens: int) -> float:
    t = time.perf_counter()
    hf_greedy_ids(model, prompts, new_tokens)
    return time.perf_counter() - t


def decode_tps(timer, batch: int, new_tokens: int) -> float:
    """Tokens/s of the decode phase: the difference between N and 1 new tokens."""
    t_full, t_one = timer(new_tokens), timer(1)
    return batch * (new_tokens - 1) / max(t_full - t_one, 1e-9)


def profile_decode(engine: LLMEngine, prompts: list[list[int]], steps: int = 16) -> dict:
    """Where a surge decode step spends its time (torch profiler, CPU ops)."""
    from torch.profiler import ProfilerActivity, profile

    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=steps + 4, ignore_eos=True))
    engine.step()  # prefill
    engine.step()
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    wall_ms = (time.perf_counter() - t) / steps * 1e3
    while engine.has_unfinished:
        engine.step()
    ops = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    mm_ms = ops.get("aten::mm", 0.0) + ops.get("aten::addmm", 0.0)
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:6]
    # The profiler slows the Python between ops, not the matmul kernels: compare the matmul
    # time with the unprofiled step time (from the throughput) in the caller.
    return {
        "step_ms_under_profiler": round(wall_ms, 3),
        "matmul_ms": round(mm_ms, 3),
        "top_ops_ms": {k: round(v, 3) for k, v in top},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="100mb")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--out", type=Path, default=RESULTS / "engine_throughput.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, store = Path(tmp) / "hf", Path(tmp) / "store"
        cfg = preset(args.preset)
        create_tiny_model(hf_dir, cfg)
        manifest = import_checkpoint(hf_dir, store, progress=False)
        engine = LLMEngine(manifest)
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        results = []
        for batch in (int(b) for b in args.batches.split(",")):
            prompts = prompts_for(batch, args.prompt_len, cfg.vocab_size)
            time_surge(engine, prompts, 4)  # warm-up both
            time_hf(hf, prompts, 4)
            surge_tps, hf_tps = [], []
            for r in range(args.rounds):
                surge_tps.append(
                    decode_tps(
                        lambda n, p=prompts: time_surge(engine, p, n), batch, args.new_tokens
                    )
                )
                hf_tps.append(
                    decode_tps(lambda n, p=prompts: time_hf(hf, p, n), batch, args.new_tokens)
                )
                log.info(
                    "batch %d round %d: surge %.1f tok/s, transformers %.1f tok/s",
                    batch,
                    r,
                    surge_tps[-1],
                    hf_tps[-1],
                )
            s, h = statistics.median(surge_tps), statistics.median(hf_tps)
            prof = profile_decode(engine, prompts)
            surge_step_ms, hf_step_ms = 1e3 * batch / s, 1e3 * batch / h
            prof["surge_step_ms"] = round(surge_step_ms, 3)
            prof["matmul_share_of_step"] = round(prof["matmul_ms"] / surge_step_ms, 3)
            # Upper bound on the ratio if everything but the matmuls cost nothing.
            prof["max_ratio_matmul_only"] = round(hf_step_ms / prof["matmul_ms"], 3)
            log.info("batch %d surge decode profile: %s", batch, prof)
            results.append(
                {
                    "batch": batch,
                    "surge_decode_tok_s": round(s, 2),
                    "transformers_decode_tok_s": round(h, 2),
                    "ratio": round(s / h, 3),
                    "surge_rounds": [round(x, 2) for x in surge_tps],
                    "transformers_rounds": [round(x, 2) for x in hf_tps],
                    "surge_decode_profile": prof,
                }
            )
    report = {
        "benchmark": "engine_throughput",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": "cpu",
        },
        "settings": {
            "preset": args.preset,
            "params": sum(b.size_bytes for b in manifest.blocks) // 4,
            "dtype": cfg.dtype,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "rounds": args.rounds,
        },
        "goals": {"batch_1_ratio": 1.0, "batch_8_ratio": 1.5},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"))
    print(json.dumps(results, indent=1))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(res))
    ax.bar(
        [i - 0.2 for i in x],
        [r["transformers_decode_tok_s"] for r in res],
        0.4,
        label="transformers generate",
    )
    ax.bar([i + 0.2 for i in x], [r["surge_decode_tok_s"] for r in res], 0.4, label="surge engine")
    for i, r in enumerate(res):
        ax.text(i + 0.2, r["surge_decode_tok_s"], f"{r['ratio']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(list(x), [f"batch {r['batch']}" for r in res])
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"Decode throughput, {report['settings']['preset']} model, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
