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


def prompts_for(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random prompts; a new `seed` per measurement, so no engine's prefix cache hits."""
    rng = random.Random(seed * 1_000_003 + batch * 1000 + prompt_len)
    return [[rng.randrange(2, vocab) for _ in range(prompt_len)] for _ in range(batch)]


def surge_runner(model_dir: str, dtype: str, compile_decode: bool = True):
    """surge with its defaults; as a warm node, its decode graphs compiled (in the background,
    as ever) before the first measurement."""
    # The store holds the checkpoint's dtype; surge runs it as stored.
    from surge.config import EngineConfig
    from surge.engine.llm_engine import LLMEngine
    from surge.engine.sampling import SamplingParams
    from surge.model.manifest import read_manifest

    engine = LLMEngine(read_manifest(Path(model_dir)), EngineConfig(compile_decode=compile_decode))
    graph = engine.executor.runner.decode_graph
    if graph is not None:
        graph.wait()

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        outs = engine.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        return [o.token_ids for o in outs]

    def stats() -> dict:
        """The compiled decode step's graphs so far, and steps that ran eager."""
        if graph is None:
            return {}
        return {
            "num_compiles": graph.num_compiles,
            "compile_s": round(graph.compile_s, 1),
            "compiled_steps": graph.num_calls,
            "eager_decode_steps": graph.num_eager_steps,
        }

    def settle() -> None:
        """Before a measurement: a graph whose compile a new batch class started (batches
        above `gemv.max_rows()` get theirs when they first come, in the background) is ready,
        as on a warm node that has served that batch before; never timed."""
        if graph is not None:
            graph.wait()

    run.stats = stats  # type: ignore[attr-defined]
    run.settle = settle  # type: ignore[attr-defined]
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


def vllm_runner(model_dir: str, dtype: str, max_len: int = 1024):
    from vllm import LLM, SamplingParams  # type: ignore[import-not-found]

    # Its default configuration (compiled), the checkpoint's dtype, no tokenizer (ids in/out).
    llm = LLM(model=model_dir, dtype=dtype, skip_tokenizer_init=True, max_model_len=max_len)

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return run


def surge_eager_runner(model_dir: str, dtype: str):
    """surge with `EngineConfig.compile_decode` off (every step eager)."""
    return surge_runner(model_dir, dtype, compile_decode=False)


RUNNERS = {
    "surge": surge_runner,
    "surge-eager": surge_eager_runner,
    "transformers": transformers_runner,
    "vllm": vllm_runner,
}


def worker(name: str, model_dir: str, vocab: int, dtype: str, max_len: int) -> None:
    """Answer one JSON line per request on stdin: {batch, prompt_len, new_tokens, seed}.
    With new_tokens 1 (a prefill measurement) the run is timed once; otherwise also with 1
    new token on other prompts, so decode = the difference."""
    kw = {"max_len": max_len} if name == "vllm" else {}
    run = RUNNERS[name](model_dir, dtype, **kw)
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the engine prints must not mix with the answers
    print("READY", file=out, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        batch, prompt_len, new = req["batch"], req["prompt_len"], req["new_tokens"]
        prompts = prompts_for(batch, prompt_len, vocab, 2 * req["seed"])
        getattr(run, "settle", lambda: None)()
        t, c = time.perf_counter(), time.process_time()
        tokens = run(prompts, new)
        t_full, c_full = time.perf_counter() - t, time.process_time() - c
        t_one, c_one = t_full, c_full
        if new > 1:
            other = prompts_for(batch, prompt_len, vocab, 2 * req["seed"] + 1)
            t, c = time.perf_counter(), time.process_time()
            run(other, 1)
            t_one, c_one = time.perf_counter() - t, time.process_time() - c
        assert all(len(x) == new for x in tokens)
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
    ap.add_argument("--max-len", type=int, default=1024, help="vLLM's max_model_len")
    args = ap.parse_args()
    worker(args.worker, args.model_dir, args.vocab, args.dtype, args.max_len)


if __name__ == "__main__":
    main()
