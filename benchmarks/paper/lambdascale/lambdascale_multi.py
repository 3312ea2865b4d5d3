"""λScale §7.5 multi-model ("up to 5x lower tail latency"): scenario `lambdascale-multi` over
a fixed set of seeds, and its REPORT.md row.

The tail is the 90th percentile of TTFT (`TAIL_TTFT`, λScale §1 and FaaScale §1).

The simulator is deterministic; the scenario's seed draws which of the 12 models each
request goes to (Zipf split of both traces) and which quarter of Azure conv the 7B group
takes (`surge.sim.scenario_traffic.build_trace`). ServerlessLLM's tail TTFT is the tail
of a few dozen SSD loads, so which loads miss its host cache, and the ratio, turn on that
draw (seeds 0-10, p99: 5.41x-8.26x, 2026-11-28): one seed is one draw, so the row's
headline is the median over MULTI_SEEDS with the range beside it.
"""

import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows

from common import ratio, run, run_scenario
from lambdascale_bursts import sllm_start_from_fig12
from rows import row

from surge.sim.scenario import load_scenario
from surge.sim.scenario_traffic import build_trace

MULTI_SEEDS = tuple(range(11))
"""The scenario's own seed 0 and ten more, fixed before any seed's result was seen (an odd
count: the median is one seed's run); the headline is their median whichever way it moves
the row. About 15 s of one core per seed."""
JUDGED = ("faasnet", "nccl", "serverlessllm-fig12start", "serverlessllm", "serverlessllm-init0")
"""The ratios the row reports (each system's tail TTFT over λScale's)."""
TAIL_TTFT = "ttft_p90_s"
"""The tail the paper's "up to 5x" measures: λScale §1 "a 2.4x to 5x improvement in 90th
tail latency ... on real-world LLM inference traces"; FaaScale §1 "2.4x-5x improvement in
P90 TTFT latency" (abstract: "up to 5x lower tail time-to-first-token latency"). The rows
took p99 until 2026-11-28."""


def multi_runs(seed: int) -> tuple[int, dict]:
    """Requests and each system's summary on `lambdascale-multi` at `seed`, with S-LLM also
    at no engine start and at the one Fig. 12 implies (its shipped 0.5 s is not in the
    λScale paper): what the row rests on."""
    scn = replace(load_scenario("lambdascale-multi"), seed=seed)
    trace = build_trace(scn)
    res = {name: run_scenario(scn, trace, name)[0] for name in scn.systems}
    sllm = scn.system("serverlessllm")
    for key, init_s in (("init0", 0.0), ("fig12start", sllm_start_from_fig12())):
        cfg = replace(sllm, init_s=init_s)
        res[f"serverlessllm-{key}"] = run(trace, scn.settings("serverlessllm"), cfg)[0]
    return trace.num_requests, res


def seed_summary(requests: int, res: dict) -> dict:
    """One seed's tail TTFTs (p90, and p99 beside), their ratios over λScale and S-LLM's
    host-cache misses."""
    lam = res["lambdascale"][TAIL_TTFT]
    return {
        "requests": requests,
        "ttft_p90_s": {k: v["ttft_p90_s"] for k, v in res.items()},
        "ttft_p99_s": {k: v["ttft_p99_s"] for k, v in res.items()},
        "tail_ttft_ratio": {k: ratio(res[k][TAIL_TTFT], lam) for k in JUDGED},
        "p99_ttft_ratio": {
            k: ratio(res[k]["ttft_p99_s"], res["lambdascale"]["ttft_p99_s"]) for k in JUDGED
        },
        "sllm_fig12start_cache_misses": res["serverlessllm-fig12start"]["cache_misses"],
    }


def spread(per_seed: dict, key: str) -> dict:
    """Median, min and max over seeds of one ratio (`per_seed`: seed -> `seed_summary`)."""
    values = [s["tail_ttft_ratio"][key] for s in per_seed.values()]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _fmt(s: dict) -> str:
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


def multi_row(mm: dict) -> dict:
    """The §7.5 row: medians over the seeds in `mm['seeds']`, ranges beside them."""
    per_seed = mm["seeds"]
    med = {k: spread(per_seed, k) for k in JUDGED}
    misses = [s["sllm_fig12start_cache_misses"] for s in per_seed.values()]
    seeds = sorted(int(s) for s in per_seed)
    head, ship = med["serverlessllm-fig12start"], med["serverlessllm"]
    at0 = med["serverlessllm-init0"]
    every = all(s["tail_ttft_ratio"][k] > 1 for s in per_seed.values() for k in JUDGED[:3])
    return row(
        "λScale",
        "§7.5 multi-model",
        "up to 5x lower tail latency (abstract, §7.5; §1: p90 TTFT)",
        "5x",
        f"`lambdascale-multi`, median (range) over seeds {seeds[0]}-{seeds[-1]}: p90 TTFT "
        "FaaSNet / NCCL / S-LLM over λScale "
        + " / ".join(_fmt(med[k]) for k in JUDGED[:3])
        + f" (S-LLM's start derived from Fig. 12; shipped 0.5 s {_fmt(ship)}, none "
        f"{_fmt(at0)})",
        ordering=every,
        sim_value=head["median"],
        paper_value=5.0,
        cause="Judged, as Fig. 14, with S-LLM's engine start derived from Fig. 12 (the "
        "λScale paper gives none); the ratio rests on it (shipped 0.5 s "
        f"{ship['median']:.2f}x, none {at0['median']:.2f}x), the ordering does not (it holds "
        "at every seed). At the derived start S-LLM's p90 is set by its SSD loads "
        f"({min(misses)}-{max(misses)} host-cache misses), and which loads miss turns on the "
        "seed's draw of models per request: one seed is one draw, so the headline is the "
        f"median of {len(seeds)} fixed seeds ({head['min']:.2f}x-{head['max']:.2f}x; seed 0 "
        f"alone {per_seed['0']['tail_ttft_ratio']['serverlessllm-fig12start']:.2f}x) "
        "(NOTES.md, 2026-11-28).",
    )
