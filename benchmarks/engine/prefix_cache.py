"""Prefix caching: TTFT of requests that share a long system prompt, caching on vs off.

Every request is one shared system prompt (default 512 tokens) followed by its own user
turn (default 32 tokens). Requests arrive one after the other at an idle engine; TTFT is
from `add_request` to its first token. The first request fills the cache; the later ones
reuse the system prompt's KV blocks and prefill only their own turn. Two engines on the same
store (caching on, caching off) alternate request by request in the same run, so load from
the rest of the machine hits both alike; the result is the ratio of their median TTFT over
the later requests (goal: ≥ 3x lower with caching). Greedy outputs of the two are compared
too (a hit must not change a token).

Writes benchmarks/results/engine/prefix_cache.json.
Usage: python benchmarks/engine/prefix_cache.py [--preset 100mb] [--system-len 512] [--requests 8]
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

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.model.importer import import_checkpoint
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import preset

log = logging.getLogger("prefix_cache")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "engine"


def ttft_s(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> tuple[float, list]:
    """Seconds from arrival to the first token, and the request's tokens (run to the end)."""
    t = time.perf_counter()
    sid = engine.add_request(prompt, params)
    first = None
    while engine.has_unfinished:
        events = engine.step()
        if first is None and any(e.seq_id == sid for e in events):
            first = time.perf_counter() - t
    assert first is not None
    return first, engine.seqs.pop(sid).output_token_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="100mb")
    ap.add_argument("--system-len", type=int, default=512)
    ap.add_argument("--user-len", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--out", type=Path, default=RESULTS / "prefix_cache.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = preset(args.preset)
    g = torch.Generator().manual_seed(0)
    system = torch.randint(2, cfg.vocab_size, (args.system_len,), generator=g).tolist()
    prompts = [
        system + torch.randint(2, cfg.vocab_size, (args.user_len,), generator=g).tolist()
        for _ in range(args.requests)
    ]
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, store = Path(tmp) / "hf", Path(tmp) / "store"
        create_tiny_model(hf_dir, cfg)
        manifest = import_checkpoint(hf_dir, store, progress=False)
        engines = {
            on: LLMEngine(manifest, EngineConfig(enable_prefix_caching=on)) for on in (True, False)
        }
        warm = torch.randint(2, cfg.vocab_size, (args.user_len,), generator=g).tolist()
        for e in engines.values():  # warm-up on an unrelated prompt (nothing to reuse)
            ttft_s(e, warm, params)
        ttft: dict[bool, list[float]] = {True: [], False: []}
        tokens: dict[bool, list[list[int]]] = {True: [], False: []}
        for i, prompt in enumerate(prompts):
            for on in (True, False) if i % 2 else (False, True):
                t, out = ttft_s(engines[on], prompt, params)
                ttft[on].append(t)
                tokens[on].append(out)
            on_ms, off_ms = 1e3 * ttft[True][-1], 1e3 * ttft[False][-1]
            log.info("request %d: ttft on %.1f ms, off %.1f ms", i, on_ms, off_ms)
        sched = engines[True].scheduler
    later_on, later_off = statistics.median(ttft[True][1:]), statistics.median(ttft[False][1:])

    def ms(t: float) -> float:
        return round(1e3 * t, 2)

    report = {
        "benchmark": "prefix_cache",
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": str(engines[True].executor.runner.device),
        },
        "settings": {
            "preset": args.preset,
            "dtype": cfg.dtype,
            "system_len": args.system_len,
            "user_len": args.user_len,
            "requests": args.requests,
            "new_tokens": args.new_tokens,
            "page_size_tokens": EngineConfig().page_size_tokens,
            "prefill_chunk_tokens": EngineConfig().prefill_chunk_tokens,
        },
        "goal": {"later_ttft_ratio_off_over_on": 3.0},
        "results": {
            "first_ttft_ms": {"on": ms(ttft[True][0]), "off": ms(ttft[False][0])},
            "later_ttft_median_ms": {"on": ms(later_on), "off": ms(later_off)},
            "later_ttft_ratio_off_over_on": round(later_off / later_on, 2),
            "ttft_ms": {
                "on": [round(1e3 * t, 2) for t in ttft[True]],
                "off": [round(1e3 * t, 2) for t in ttft[False]],
            },
            "hit_rate": round(sched.prefix_hit_tokens / sched.prefix_query_tokens, 3),
            "same_tokens": tokens[True] == tokens[False],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["results"], indent=1))


if __name__ == "__main__":
    main()
