"""The engine side of benchmarks/engine/vs_peers.py: one process per engine, answering
measurement requests on stdin with one JSON line each on stdout.

Run as `python benchmarks/engine/workers.py --worker NAME --model-dir DIR --vocab N --dtype D`
by `vs_peers_runs.Worker`, with this repository's Python (surge, transformers) or vLLM's own
venv (vllm). The module imports nothing but the standard library at the top: in vLLM's venv
surge is not importable.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

RUNNER_DTYPES = ("float32", "bfloat16")


def prompts_for(batch: int, prompt_len: int, vocab: int) -> list[list[int]]:
    rng = random.Random(batch * 1000 + prompt_len)
    return [[rng.randrange(2, vocab) for _ in range(prompt_len)] for _ in range(batch)]


def surge_runner(
    model_dir: str, dtype: str, pack: bool = True, compile_decode: bool = False, fuse: bool = True
):
    # The store holds the checkpoint's dtype; surge runs it as stored.
    from surge.config import EngineConfig
    from surge.engine.llm_engine import LLMEngine
    from surge.engine.sampling import SamplingParams
    from surge.model.manifest import read_manifest

    config = EngineConfig(
        pack_cpu_weights=pack, compile_decode=compile_decode, fuse_projections=fuse
    )
    engine = LLMEngine(read_manifest(Path(model_dir)), config)

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        outs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        return [o.token_ids for o in outs]

    def stats() -> dict:
        """The compiled decode step's graphs so far (compile_decode only)."""
        graph = engine.executor.runner.decode_graph
        if graph is None:
            return {}
        return {"num_compiles": graph.num_compiles, "compile_s": round(graph.compile_s, 1)}

    run.stats = stats  # type: ignore[attr-defined]
    return run


def transformers_runner(model_dir: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts)
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
        return out[:, ids.shape[1] :].tolist()

    return run


def vllm_runner(model_dir: str, dtype: str):
    from vllm import LLM, SamplingParams  # type: ignore[import-not-found]

    # Its default configuration (compiled), the checkpoint's dtype, no tokenizer (ids in/out).
    llm = LLM(model=model_dir, dtype=dtype, skip_tokenizer_init=True, max_model_len=1024)

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return run


def surge_nopack_runner(model_dir: str, dtype: str):
    """surge with `EngineConfig.pack_cpu_weights` off (no oneDNN-packed projections)."""
    return surge_runner(model_dir, dtype, pack=False)


def surge_compiled_runner(model_dir: str, dtype: str):
    """surge with `EngineConfig.compile_decode` on (decode steps as one inductor graph)."""
    return surge_runner(model_dir, dtype, compile_decode=True)


def surge_unfused_runner(model_dir: str, dtype: str):
    """surge with `EngineConfig.fuse_projections` off (q, k, v, gate, up separate matmuls)."""
    return surge_runner(model_dir, dtype, fuse=False)


RUNNERS = {
    "surge": surge_runner,
    "surge-nopack": surge_nopack_runner,
    "surge-compiled": surge_compiled_runner,
    "surge-unfused": surge_unfused_runner,
    "transformers": transformers_runner,
    "vllm": vllm_runner,
}


def worker(name: str, model_dir: str, vocab: int, dtype: str) -> None:
    """Answer one JSON line per request on stdin: {batch, prompt_len, new_tokens}."""
    run = RUNNERS[name](model_dir, dtype)
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the engine prints must not mix with the answers
    print("READY", file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        prompts = prompts_for(req["batch"], req["prompt_len"], vocab)
        t, c = time.perf_counter(), time.process_time()
        tokens = run(prompts, req["new_tokens"])
        t_full, c_full = time.perf_counter() - t, time.process_time() - c
        t, c = time.perf_counter(), time.process_time()
        run(prompts, 1)
        t_one, c_one = time.perf_counter() - t, time.process_time() - c
        assert all(len(x) == req["new_tokens"] for x in tokens)
        ans = {"t_full_s": t_full, "t_one_s": t_one, "first_tokens": tokens[0]}
        ans |= {"cpu_full_s": c_full, "cpu_one_s": c_one}
        ans |= getattr(run, "stats", dict)()
        print("RESULT " + json.dumps(ans), file=out, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=sorted(RUNNERS), required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--dtype", choices=RUNNER_DTYPES, default="float32")
    args = ap.parse_args()
    worker(args.worker, args.model_dir, args.vocab, args.dtype)


if __name__ == "__main__":
    main()
