"""BlitzScale's load-monitor bounds on a CPU host: the engine's step profile and the host
estimates vs the engine measured.

`surge serve` without GPU-time emulation derives the §5.3 monitor's per-instance bounds from
a step profile of the real engine taken at deploy time (`engine/step_profile.py`,
`runtime/step_profiles.py`, `policy.blitzscale.monitor.profile_costs`), or, with no profile,
from the host's rule-of-thumb estimates (`control/emulation.instance_costs`,
`runtime/scaleout/estimates.py`). This measures the same engine (the default model's store,
SmolLM2-135M-Instruct fp32 where setup imported it, else the tiny model; `EngineConfig`
defaults but prefix caching off and a distinct random prompt per call, so no prefill is a
cache hit) on this CPU: the CPU-seconds of a prefill of N prompt tokens (a `max_tokens=1`
generate) and of one decode step at batch B (`max_tokens` 17 minus 1, over 16 steps), one
torch thread. CPU time (once the background decode-graph compiles are done), not wall
time: on a shared machine wall time measures the other tenants (the result records the load
average); one thread, because two threads spin against each other on busy cores
(docs/models.md). Medians of `--reps`. Reported beside each: the
host estimate's cost and the step profile's (`measure_steps` on a fresh engine of the same
store and settings, timed on the same clock: `--profile-clock cpu`, the default here, or
`wall` as `surge serve` times it), and the monitor bounds (`policy.blitzscale.monitor.bounds`)
from the estimate, the profile and the measurement at the default SLO. Writes
benchmarks/results/engine/monitor_host_bound.json.

`--model-mb X` measures instead a tiny random model of about X MB (8 blocks, as
`benchmarks/systems/blitzscale.py` builds its own) and writes `monitor_host_bound_XMB.json`.

Usage: python -m benchmarks.engine.monitor_host_bound [--reps 3] [--threads 1] [--model-mb X]
    [--profile-clock cpu|wall]
"""

import argparse
import gc
import itertools
import json
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import model_config
from surge.config import EngineConfig
from surge.control.emulation import instance_costs
from surge.engine.compiled import wait_for_compiles
from surge.engine.llm_engine import LLMEngine
from surge.engine.sampling import SamplingParams
from surge.engine.step_profile import device_label, measure_steps
from surge.model.default_store import default_model
from surge.model.importer import import_checkpoint
from surge.model.manifest import read_manifest
from surge.model.tiny import create_tiny_model
from surge.policy.blitzscale.monitor import InstanceCosts, bounds, profile_costs
from surge.policy.slo import Slo
from surge.runtime.scaleout.estimates import HOST_ESTIMATES

log = logging.getLogger("monitor_host_bound")
OUT = Path(__file__).resolve().parents[1] / "results" / "engine" / "monitor_host_bound.json"
PREFILL_TOKENS = (32, 128, 512)
DECODE_BATCHES = (1, 8, 16, 32, 64)
DECODE_STEPS = 16


def measure(engine: LLMEngine, vocab: int, reps: int) -> dict[str, dict[int, float]]:
    """Median CPU-seconds of a prefill per prompt length and a decode step per batch."""
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    def cpu_s(prompts: list[list[int]], new_tokens: int) -> float:
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        start = time.process_time()
        engine.generate(prompts, params)
        return time.process_time() - start

    # warm-up: first-call allocations and kernels; the decode graphs compile in a background
    # thread whose CPU time would count (`engine/compiled.py`): measured once it is done
    cpu_s([prompt(64)], 4)
    wait_for_compiles()
    prefill = {
        n: statistics.median(cpu_s([prompt(n)], 1) for _ in range(reps)) for n in PREFILL_TOKENS
    }
    decode = {}
    for b in DECODE_BATCHES:
        for _ in range(2):  # warm-up at this batch (a new batch class compiles its graph)
            cpu_s([prompt(8) for _ in range(b)], 3)
            wait_for_compiles()
        long = statistics.median(
            cpu_s([prompt(8) for _ in range(b)], DECODE_STEPS + 1) for _ in range(reps)
        )
        short = statistics.median(cpu_s([prompt(8) for _ in range(b)], 1) for _ in range(reps))
        decode[b] = (long - short) / DECODE_STEPS
        log.info("batch %d: %.1f ms/step", b, decode[b] * 1e3)
    log.info("prefill %s", {n: round(s, 3) for n, s in prefill.items()})
    return {"prefill_s": prefill, "decode_step_s": decode}


def measured_costs(m: dict[str, dict[int, float]], engine: EngineConfig) -> InstanceCosts:
    """The measurement as the monitor's costs: a prefill at the largest measured prompt's
    per-token rate, a decode step interpolated between the measured batches."""
    n_max = max(PREFILL_TOKENS)
    per_token_s = m["prefill_s"][n_max] / n_max
    pts = sorted(m["decode_step_s"].items())

    def decode_s(batch: int) -> float:
        for (b0, s0), (b1, s1) in itertools.pairwise(pts):
            if batch <= b1:
                return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
        return pts[-1][1]

    return InstanceCosts(
        lambda n: n * per_token_s, decode_s, engine.max_prefill_tokens, engine.max_num_seqs
    )


def _bounds_json(costs: InstanceCosts, slo: Slo) -> dict[str, float]:
    b = bounds(costs, slo)
    return {
        "prefill_tokens_per_s": round(b.prefill_tokens_per_s, 1),
        "prompt_tokens_within_ttft_slo": round(b.prefill_tokens_per_s * slo.ttft_s),
        "decode_tokens_per_s": round(b.decode_tokens_per_s, 1),
        "decode_batch": b.decode_batch,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-mb", type=float, default=None, help="a tiny model instead")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--profile-clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_mb is None:
            store = default_model()[0]
            out = args.json or OUT
        else:
            create_tiny_model(Path(tmp) / "hf", model_config(args.model_mb, 8))
            store = Path(tmp) / f"tiny-{args.model_mb:g}mb"
            import_checkpoint(Path(tmp) / "hf", store, num_blocks=8, progress=False)
            out = args.json or OUT.with_name(f"{OUT.stem}_{args.model_mb:g}MB.json")
        run(store, args, out)


def run(store: Path, args: argparse.Namespace, out: Path) -> None:
    """Measure `store`'s engine and write the result to `out`."""
    manifest = read_manifest(store)
    config = EngineConfig(enable_prefix_caching=False)
    engine = LLMEngine(manifest, config)
    load_start = os.getloadavg()
    m = measure(engine, manifest.arch.vocab_size, args.reps)
    del engine
    gc.collect()
    clock = time.process_time if args.profile_clock == "cpu" else time.perf_counter
    profile_start_s = time.perf_counter()
    steps = measure_steps(manifest, config, clock=clock)
    profile_took_s = time.perf_counter() - profile_start_s
    profile = profile_costs(steps, config.max_prefill_tokens, config.max_num_seqs)
    estimate = instance_costs(None, HOST_ESTIMATES, manifest.total_bytes, config)
    slo = Slo()
    result = {
        "benchmark": "monitor_host_bound",
        "store": store.name,
        "store_bytes": manifest.total_bytes,
        "conditions": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "reps": args.reps,
            "note": "CPU-seconds of this process (one thread), medians; a shared 2-core VM",
        },
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "measured": {
            "prefill_s": {str(n): round(s, 4) for n, s in m["prefill_s"].items()},
            "prefill_tokens_per_s": {str(n): round(n / s, 1) for n, s in m["prefill_s"].items()},
            "decode_step_s": {str(b): round(s, 4) for b, s in m["decode_step_s"].items()},
        },
        "host_estimate": {
            "prefill_s": {str(n): round(estimate.prefill_s(n), 4) for n in PREFILL_TOKENS},
            "decode_step_s": {str(b): round(estimate.decode_s(b), 4) for b in DECODE_BATCHES},
        },
        "profile": {
            "clock": args.profile_clock,
            "device": device_label(config),
            "took_s": round(profile_took_s, 1),
            "prefill_s": {str(n): round(s, 4) for n, s in steps.prefill_s},
            "decode_step_s": {str(b): round(s, 4) for b, s in steps.decode_s},
        },
        "bounds": {
            "host_estimate": _bounds_json(estimate, slo),
            "profile": _bounds_json(profile, slo),
            "measured": _bounds_json(measured_costs(m, config), slo),
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log.info("%s", json.dumps(result["bounds"], indent=1))


if __name__ == "__main__":
    main()
