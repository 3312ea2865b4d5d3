"""λScale on the Azure traces: Fig. 2 and 3 (host-cache keep-alive and misses), Fig. 14
(GPU time on a 30-minute bursty trace) and the same comparison on a multi-model cluster.

- Fig. 2 (§2.3): 12 models, node memory holds 3, LRU (`policy.copies.keepalive.admit`), each
  model ~1 request per minute per node. The paper's own method is a trace-driven cache
  simulation; we replay the Azure code trace over 12 nodes (its 2.57 req/s over 12 x 12
  model-node pairs is 1.07 per minute each) and, for contrast, Poisson arrivals.
- Fig. 3 (§2.3): the same caches with a 15-s keep-alive (`policy.copies.keepalive.expired`):
  the share of requests that find the model on a GPU (hot: a request of that model is
  still running there), in host memory, or only on SSD; both Azure traces, 6 nodes
  (Testbed2). Also the full simulator (scenario `lambdascale-fig3`, ServerlessLLM).
- Fig. 14 (§7.5): GPU-seconds, Llama-2 13B on Testbed1, the first 30 minutes of
  azure-code and azure-conv (BurstGPT is not in shared/traces); ServerlessLLM with its
  1-TB host cache never evicting (as before) and with its default 5-minute keep-alive.
- Multi-model (scenario `lambdascale-multi`): 12 models of two sizes competing for 16
  GPUs and 64-GiB host caches; GPU-seconds and TTFT tails, over the seeds of
  `lambdascale_multi.MULTI_SEEDS` (the row is their median).
Run: python benchmarks/paper/lambdascale/lambdascale_traces.py (about four minutes on one
core; --only fig2 / fig3 / fig14 / multi_model reruns those into the existing JSON).
"""

import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows

from common import only_parts, ratio, read, run, run_main, run_scenario, write
from lambdascale_bursts import sllm_start_from_fig12
from lambdascale_multi import MULTI_SEEDS, TAIL_TTFT, multi_row, multi_runs, seed_summary
from rows import row

from surge.policy.copies.keepalive import CacheEntry, CacheSettings, admit, expired
from surge.policy.systems import system_config
from surge.sim.scenario import load_scenario
from surge.sim.scenario_traffic import build_trace
from surge.sim.settings import SimSettings
from surge.traces.resolve import load_trace
from surge.traces.transform import time_slice

log = logging.getLogger("lambdascale_traces")
TPOT_70B_S = 0.03
"""Decode time per token of a 70B request (what keeps a model hot on its GPU in Fig. 3)."""


def cache_replay(
    arrival_s: np.ndarray,
    node: np.ndarray,
    model: np.ndarray,
    num_nodes: int,
    keep_alive_s: float | None,
    busy_s: np.ndarray | None = None,
    capacity: int = 3,
) -> dict:
    """Per-node host caches of `capacity` models (the paper's 3) driven by the policy;
    lifetimes and load kinds."""
    settings = CacheSettings(capacity, keep_alive_s)
    caches: list[dict[str, CacheEntry]] = [{} for _ in range(num_nodes)]
    since: list[dict[str, float]] = [{} for _ in range(num_nodes)]
    running: list[dict[str, float]] = [{} for _ in range(num_nodes)]
    lifetimes: list[float] = []
    kinds = {"hot": 0, "memory": 0, "ssd": 0}
    for i, (t, n, m) in enumerate(zip(arrival_s, node, model, strict=True)):
        cache, name = caches[n], f"m{m}"
        for victim in expired(tuple(cache.values()), float(t), settings):
            del cache[victim]
            lifetimes.append(float(t) - since[n].pop(victim))
        if running[n].get(name, -1.0) >= t:
            kinds["hot"] += 1
        else:
            kinds["memory" if name in cache else "ssd"] += 1
        entry = CacheEntry(name, 1, float(t))
        for victim in admit(tuple(cache.values()), entry, settings).evict:
            del cache[victim]
            lifetimes.append(float(t) - since[n].pop(victim))
        since[n].setdefault(name, float(t))
        cache[name] = entry
        if busy_s is not None:
            running[n][name] = max(running[n].get(name, -1.0), float(t + busy_s[i]))
    life = np.array(lifetimes)
    total = sum(kinds.values())
    return {
        "evictions": len(life),
        "share_under_15s": float((life < 15).mean()) if len(life) else None,
        "lifetime_p50_s": float(np.median(life)) if len(life) else None,
        "lifetime_p95_s": float(np.percentile(life, 95)) if len(life) else None,
        "lifetimes_s": np.sort(life)[:: max(1, len(life) // 400)].tolist(),
        **{f"{k}_share": v / total for k, v in kinds.items()},
        "ssd_share_of_loads": kinds["ssd"] / max(kinds["ssd"] + kinds["memory"], 1),
    }


def fig2(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    code = load_trace("azure-code")
    n = code.num_requests
    per_min = n / code.duration_s * 60 / (12 * 12)
    azure = cache_replay(code.arrival_s, rng.integers(0, 12, n), rng.integers(0, 12, n), 12, None)
    t = np.sort(rng.uniform(0, 3600, 12 * 12 * 60))
    m = len(t)
    poisson = cache_replay(t, rng.integers(0, 12, m), rng.integers(0, 12, m), 12, None)
    return {
        "azure_code": azure,
        "poisson": poisson,
        "requests_per_model_per_node_per_min": per_min,
        "paper": {"share_under_15s": 0.95},
    }


def fig3(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out: dict = {}
    for name in ("azure-code", "azure-conv"):
        tr = load_trace(name)
        n = tr.num_requests
        busy = tr.output_tokens * TPOT_70B_S
        node, model = rng.integers(0, 6, n), rng.integers(0, 12, n)
        out[name] = cache_replay(tr.arrival_s, node, model, 6, 15.0, busy)
        # counterfactual: room for all 12 models per node, so only the keep-alive evicts
        out[name]["ssd_share_room_for_all"] = cache_replay(
            tr.arrival_s, node, model, 6, 15.0, busy, capacity=12
        )["ssd_share"]
        scn = load_scenario("lambdascale-fig3")
        g = scn.groups[0]
        scn = replace(scn, groups=(replace(g, arrivals=replace(g.arrivals, trace=name)),))
        summary, res = run_scenario(scn, build_trace(scn), "serverlessllm")
        loads = res.cache_hits + res.cache_misses
        out[name]["simulator"] = {
            "ssd_share_of_loads": res.cache_misses / max(loads, 1),
            "memory_loads": res.cache_hits,
            "ssd_loads": res.cache_misses,
            "hot_requests": res.hot_requests,
            "requests": summary["requests"],
        }
    out["paper"] = {"ssd_share": "0.64 / 0.36 (two traces)"}
    return out


FIG14_SYSTEMS = ("lambdascale", "faasnet", "nccl", "serverlessllm", "serverlessllm-5min", "ideal")
FIG14_COUNTERFACTUALS = {
    # S-LLM missing its host cache on every load (the paper's S-LLM shared its hosts)
    "serverlessllm-ssd": lambda: replace(system_config("serverlessllm"), host_cache="none"),
    # FaaSNet never back to SSD: one instance kept through the trace's empty minutes
    "faasnet-keep1": lambda: replace(
        system_config("faasnet"),
        autoscale=replace(system_config("faasnet").autoscale, min_replicas=1),
    ),
    # S-LLM with its engine start as λScale's Fig. 12 implies it (the rows judge this one)
    "serverlessllm-fig12start": lambda: replace(
        system_config("serverlessllm"), init_s=sllm_start_from_fig12()
    ),
    # ... and at its most favourable bound, no engine start: what the orderings rest on
    "serverlessllm-init0": lambda: replace(system_config("serverlessllm"), init_s=0.0),
}
"""Fig. 14's measured causes (azure-code only): change one assumption per baseline."""


def fig14() -> dict:
    out = {}
    for name in ("azure-code", "azure-conv"):
        trace = time_slice(load_trace(name), 0.0, 1800.0)
        res = {}
        extra = FIG14_COUNTERFACTUALS if name == "azure-code" else {}
        for sys_name in (*FIG14_SYSTEMS, *extra):
            base = sys_name.removesuffix("-5min")
            cfg = extra[sys_name]() if sys_name in extra else system_config(base)
            if sys_name.endswith("-5min"):
                cfg = replace(cfg, keep_alive_s=300.0)
            settings = SimSettings("lambdascale-testbed1", ("llama2-13b",), cfg.name)
            res[sys_name], _ = run(trace, settings, cfg)
        out[name] = _savings(res)
    out["paper"] = {
        "saving_vs_faasnet": 0.178,
        "saving_vs_nccl": 0.181,
        "saving_vs_serverlessllm": 0.313,
        "gap_to_ideal": "0.043-0.186",
    }
    return out


def _savings(res: dict) -> dict:
    lam = res["lambdascale"]["gpu_seconds"]
    out = {"systems": res, "gap_to_ideal": lam / res["ideal"]["gpu_seconds"] - 1}
    for other in res:
        if other not in ("lambdascale", "ideal"):
            out[f"saving_vs_{other}"] = 1 - lam / res[other]["gpu_seconds"]
            out[f"p99_ttft_ratio_{other}"] = ratio(
                res[other]["ttft_p99_s"], res["lambdascale"]["ttft_p99_s"]
            )
            out[f"tail_ttft_ratio_{other}"] = ratio(
                res[other][TAIL_TTFT], res["lambdascale"][TAIL_TTFT]
            )
    return out


def multi_model() -> dict:
    """Seed 0's full record (as before) and every seed of MULTI_SEEDS (`lambdascale_multi`)."""
    runs = {seed: multi_runs(seed) for seed in MULTI_SEEDS}
    requests, res = runs[0]
    return {
        "scenario": "lambdascale-multi",
        "requests": requests,
        **_savings(res),
        "seeds": {str(seed): seed_summary(*runs[seed]) for seed in MULTI_SEEDS},
    }


def draw(doc: dict) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(20, 4))
    for key, label in (("azure_code", "Azure code"), ("poisson", "Poisson")):
        life = doc["fig2"][key]["lifetimes_s"]
        ax[0].plot(life, np.linspace(0, 1, len(life)), label=label)
    ax[0].axvline(15, ls=":", c="grey")
    ax[0].set(xscale="log", xlabel="time in host memory (s)", ylabel="CDF", title="Fig. 2")
    ax[0].legend()
    traces = ("azure-code", "azure-conv")
    bottom = np.zeros(2)
    for kind in ("hot", "memory", "ssd"):
        vals = np.array([doc["fig3"][t][f"{kind}_share"] for t in traces])
        ax[1].bar(traces, vals, bottom=bottom, label=kind)
        bottom += vals
    ax[1].set(title="Fig. 3: share of requests", ylim=(0, 1))
    ax[1].legend()
    for i, (title, d) in enumerate(
        (("Fig. 14 azure-code", doc["fig14"]["azure-code"]), ("multi-model", doc["multi_model"]))
    ):
        names = list(d["systems"])
        ax[2 + i].bar(names, [d["systems"][n]["gpu_seconds"] for n in names])
        ax[2 + i].set(title=f"{title}: GPU-seconds")
        ax[2 + i].tick_params(axis="x", rotation=45)
    return fig


def report_rows(doc: dict) -> list[dict]:
    """REPORT.md rows (`report.py`)."""
    f2, f3, code, mm = doc["fig2"], doc["fig3"], doc["fig14"]["azure-code"], doc["multi_model"]
    ssd = (f3["azure-code"]["ssd_share"], f3["azure-conv"]["ssd_share"])
    save = {k: code[f"saving_vs_{k}"] for k in ("faasnet", "nccl", "serverlessllm")}
    shipped = save["serverlessllm"]
    if "saving_vs_serverlessllm-fig12start" in code:  # S-LLM's start derived, not shipped
        save["serverlessllm"] = code["saving_vs_serverlessllm-fig12start"]
    tail = {k: code[f"tail_ttft_ratio_{k}"] for k in ("faasnet", "nccl", "serverlessllm")}
    shipped_tail = tail["serverlessllm"]
    if "tail_ttft_ratio_serverlessllm-fig12start" in code:  # judged as Fig. 14 is
        tail["serverlessllm"] = code["tail_ttft_ratio_serverlessllm-fig12start"]
    nan = float("nan")
    at0 = {
        "saving": code.get("saving_vs_serverlessllm-init0", nan),
        "tail": code.get("tail_ttft_ratio_serverlessllm-init0", nan),
    }
    keep1 = code.get("tail_ttft_ratio_faasnet-keep1", nan)
    return [
        row(
            "λScale",
            "Fig. 2",
            "keep-alive with 12 models, 3 per node, LRU: > 95% of models stay < 15 s",
            "95%",
            f"{f2['azure_code']['share_under_15s']:.1%} on azure-code (Poisson at the same "
            f"rate {f2['poisson']['share_under_15s']:.1%})",
            ordering=None,
            sim_value=f2["azure_code"]["share_under_15s"],
            paper_value=0.95,
            cause="The share grows with burstiness (Poisson 43% -> Azure code 76%, same "
            "rate); the paper's BurstGPT is burstier and is not in shared/traces.",
        ),
        row(
            "λScale",
            "Fig. 3",
            "SSD loads with a 15-s keep-alive: 64% / 36% of requests (two traces)",
            "64% / 36%",
            f"azure-code {ssd[0]:.0%}, azure-conv {ssd[1]:.0%}",
            ordering=ssd[0] > ssd[1],
            pairs=((ssd[0], 0.64), (ssd[1], 0.36)),
            cause="With the per-node LRU of 3 of 12 models most misses are capacity "
            "misses, not keep-alive ones; the paper states neither its node count nor its "
            "routing. Counterfactual: room for all 12 models per node (only the 15-s "
            "keep-alive evicts): SSD share code "
            f"{ssd[0]:.0%} -> {f3['azure-code'].get('ssd_share_room_for_all', float('nan')):.0%}"
            f", conv {ssd[1]:.0%} -> "
            f"{f3['azure-conv'].get('ssd_share_room_for_all', float('nan')):.0%} (paper 64% / "
            "36%).",
        ),
        row(
            "λScale",
            "Fig. 14",
            "GPU time, 30-min bursty trace (13B, Testbed1; Azure code for BurstGPT): 17.8% / "
            "18.1% / 31.3% less than FaaSNet / NCCL / ServerlessLLM",
            "17.8% / 18.1% / 31.3%",
            " / ".join(f"{v:.1%}" for v in save.values())
            + f" (S-LLM's start derived from Fig. 12; {shipped:.1%} with the shipped 0.5 s); "
            + f"{code['gap_to_ideal']:.0%} above Ideal",
            ordering=min(save.values()) > 0,
            reductions=tuple(zip(save.values(), (0.178, 0.181, 0.313), strict=True)),
            cause=None
            if "saving_vs_serverlessllm-ssd" not in code
            else "One model on 1-TB hosts: S-LLM hits its host cache on most loads, while "
            "FaaSNet and NCCL load from SSD after each of Azure code's empty minutes (no GPU "
            "copy left). Counterfactuals: S-LLM missing every load: saving vs S-LLM "
            f"{shipped:.1%} -> {code['saving_vs_serverlessllm-ssd']:.1%}; FaaSNet "
            f"keeping one instance: vs FaaSNet {save['faasnet']:.1%} -> "
            f"{code['saving_vs_faasnet-keep1']:.1%} (paper 31.3% / 17.8%: BurstGPT, not in "
            "shared/traces). The saving vs S-LLM rests on S-LLM's engine start, which the "
            f"λScale paper does not give: with none, {at0['saving']:.1%}.",
        ),
        row(
            "λScale",
            "Fig. 15",
            'TTFT CDF on the bursty trace: λScale ahead of every baseline; §1: "a 2.4x to '
            "5x improvement in 90th tail latency ... compared to the baselines on real-world "
            'LLM inference traces"',
            "2.4x-5x",
            "p90 TTFT FaaSNet / NCCL / S-LLM over λScale: "
            + " / ".join(f"{v:.2f}x" for v in tail.values())
            + f" (S-LLM's start derived from Fig. 12; shipped 0.5 s {shipped_tail:.2f}x, "
            f"none {at0['tail']:.2f}x)",
            ordering=min(tail.values()) > 1,
            sim_range=(min(tail.values()), max(tail.values())),
            paper_range=(2.4, 5.0),
            cause="FaaSNet and NCCL fall back to SSD after each of Azure code's empty "
            "minutes (no GPU copy left) whatever the start, so their p90 is an SSD load; "
            f"counterfactual: FaaSNet keeping one instance {keep1:.4f}x (the ordering then "
            "fails). The lead over S-LLM is mostly S-LLM's engine start (derived from Fig. "
            f"12, as Fig. 14 is judged): with none, {at0['tail']:.2f}x. Judged "
            "against §1's range (p90, the baselines; the λScale paper's Fig. 15 ran "
            "BurstGPT, not in shared/traces) since 2026-11-28; ordering only before.",
        ),
        multi_row(mm),
    ]


PARTS = ("fig2", "fig3", "fig14", "multi_model")
"""The pieces of a run (`--only` reruns some into the existing JSON)."""


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    only = only_parts(__doc__.split("\n")[0], PARTS, argv)
    doc = {k: v for k, v in read("lambdascale_traces").items() if k != "machine"} if only else {}
    make = {"fig2": fig2, "fig3": fig3, "fig14": fig14, "multi_model": multi_model}
    for name in [p for p in PARTS if p in (only or PARTS)]:
        log.info("running %s", name)
        doc[name] = make[name]()
    write("lambdascale_traces", doc, draw(doc))


if __name__ == "__main__":
    sys.exit(run_main(main))
