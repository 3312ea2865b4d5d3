"""λScale Fig. 8 (block arrivals), 10 (scaling via the local cache), 11 (cold start) and
18 (block count) in the simulator, at the paper's scale (Testbed1: 12 H800 nodes, 400 Gb/s;
Testbed2 for 70B: 4 nodes x 4 GPUs).

- Fig. 8: arrival time of every block of Llama-2 13B at two nodes (A = node 1, B = the
  last) for λScale, FaaSNet and NCCL at 4, 8 and 12 nodes (k = 1). Paper: λScale's first
  and last blocks arrive close together at every size; NCCL has a high first-block tail
  (group creation); FaaSNet's tail grows with the cluster. No number.
- Fig. 10: R nodes serve the model, k nodes load it from their own host memory (k = 8 for
  7B/13B, N = 12; k = 2 for 70B, N = 4), under a stress load; time until the cluster's
  token rate reaches 80% of its peak, ServerlessLLM / λScale. Paper: "2x to over 4x".
- Fig. 11: cold start: no GPU holds the model, one node's host memory does; λScale loads
  it there and multicasts over GDR (k = 1), ServerlessLLM loads that node from memory and
  the others from SSD. Same ramp metric. Paper: 3.75x to 11.4x over the three sizes.
- Fig. 18: multicast completion of 13B to 12 nodes for B = 8, 16, 24, 32, 48 under the
  policy's timing model with a per-transfer overhead DERIVED from this project's runtime
  (`benchmarks/results/scaleout/multicast.json`: measured completion minus the plan's optimum, per
  plan step). Paper: 16 blocks is the fastest.
ServerlessLLM's engine start is not in the λScale paper (ours ships 0.5 s): Fig. 10/11 run
it as λScale's Fig. 12 implies (`lambdascale_bursts.sllm_start_from_fig12`), at 0.5 s and
at 0 (the bound most favourable to ServerlessLLM); the rows judge the derived one.
Run: python benchmarks/paper/lambdascale/lambdascale_figs.py (about 30 s).
"""

import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows

from common import run, run_main, write
from lambdascale_bursts import sllm_start_cause, sllm_start_from_fig12
from multicast import isolated_multicast
from ramp import smooth, time_to_share, token_rate
from rows import row

from surge.policy.multicast.block_count import BlockCountSettings, completion_s
from surge.policy.multicast.cluster import Cluster
from surge.policy.systems import system_config
from surge.sim.hardware import cluster_from_spec, cluster_spec
from surge.sim.models import load_model
from surge.sim.settings import SimSettings
from surge.traces.request import make_trace

log = logging.getLogger("lambdascale_figs")
PAPER = "λScale"
TB1 = "lambdascale-testbed1"
MULTICAST_JSON = Path(__file__).resolve().parents[2] / "results" / "scaleout" / "multicast.json"
RAMP_SHARE = 0.8
"""A ramp ends when the token rate (averaged over SMOOTH_BINS) first reaches this share of
the best rate any system reaches on the same load (the full cluster serving)."""
SMOOTH_BINS = 5
STEP_S = 0.1
MAX_BATCH = 8
"""As lambdascale_bursts.py: the load must exceed what the serving nodes hold."""


def testbed2(nodes: int = 4) -> object:
    """Testbed2 cut to `nodes` nodes (Fig. 7: 70B on 4 nodes x 4 GPUs)."""
    g = {**cluster_spec("lambdascale-testbed2")["groups"][0], "num_nodes": nodes}
    return cluster_from_spec(f"lambdascale-testbed2/{nodes}", {"groups": [g]})


def stress(rate_rps: float, duration_s: float, burst: int) -> object:
    """`burst` requests at t = 0, then `rate_rps` for `duration_s` (1024 in, 64 out): more
    than the cluster serves, so the autoscaler asks for every node at once."""
    t = np.concatenate([np.zeros(burst), np.arange(int(rate_rps * duration_s)) / rate_rps])
    return make_trace("stress", t, np.full(len(t), 1024), np.full(len(t), 64))


# (model, cluster, stress rate, seconds, nodes, warm nodes R for Fig. 10); 70B runs longer:
# its SSD loads (140 GB at 40 Gb/s) take 28 s
SIZES = (
    ("llama2-7b", TB1, 300.0, 30.0, 12, 4),
    ("llama2-13b", TB1, 200.0, 30.0, 12, 4),
    ("llama2-70b", "testbed2/4", 40.0, 60.0, 4, 2),
)


def _ramp(model: str, cluster: object, trace, cfg, warm: int, micro: int | None = None) -> dict:
    """One run's token rate (`_rate`, dropped before writing) and numbers; `micro`:
    micro-batches per execution pipeline (None: one per stage, λScale §4.3)."""
    settings = SimSettings(
        cluster,
        (model,),
        cfg.name,
        warm_instances=warm,
        max_batch=MAX_BATCH,
        pipeline_micro_batches=micro,
    )
    summary, res = run(trace, settings, cfg)
    end = float(trace.arrival_s.max())
    times, rate = token_rate(res, trace, STEP_S, end)
    return {
        "_rate": (times, rate),
        "peak_tokens_per_s": float(smooth(rate, SMOOTH_BINS).max()),
        "ttft_p90_s": summary["ttft_p90_s"],
        "loads": {"memory": res.cache_hits, "ssd": res.cache_misses, "gdr": res.network_loads},
        "rate_curve": rate[: int(10 / STEP_S)].round(1).tolist(),
    }


def _scaling(fig: str, host_cache: str, warm_of, start_s: float) -> dict:
    """Fig. 10 (`all` host caches, R warm) or Fig. 11 (`pinned-one`, none warm); `start_s`:
    ServerlessLLM's engine start as λScale's Fig. 12 implies it."""
    lam = replace(system_config("lambdascale"), max_sources=1, host_cache=host_cache)
    sllm = replace(system_config("serverlessllm"), host_cache=host_cache)
    out: dict = {}
    for model, cluster_name, rate, seconds, nodes, r_warm in SIZES:
        cluster = testbed2() if cluster_name == "testbed2/4" else cluster_name
        warm = warm_of(r_warm)
        trace = stress(rate, seconds, nodes * MAX_BATCH * 2)
        log.info("%s %s", fig, model)
        res = {
            "lambdascale": _ramp(model, cluster, trace, lam, warm),
            "serverlessllm": _ramp(model, cluster, trace, sllm, warm),
            "serverlessllm-init0": _ramp(model, cluster, trace, replace(sllm, init_s=0.0), warm),
            "serverlessllm-fig12start": _ramp(
                model, cluster, trace, replace(sllm, init_s=start_s), warm
            ),
            # counterfactual: one batch at a time through a pipeline's stages
            "lambdascale-one-batch": _ramp(model, cluster, trace, lam, warm, micro=1),
        }
        best = max(v["peak_tokens_per_s"] for v in res.values())
        for v in res.values():
            times, r = v.pop("_rate")
            ramp = time_to_share(times, r, RAMP_SHARE, SMOOTH_BINS, best)
            v["ramp_s"] = seconds if ramp is None else ramp  # never: at least the run
            v["ramp_reached"] = ramp is not None
        lam_s = res["lambdascale"]["ramp_s"]
        out[model] = {
            "nodes": nodes,
            "warm": warm,
            "systems": res,
            "ramp_ratio": res["serverlessllm"]["ramp_s"] / lam_s,
            "ramp_ratio_init0": res["serverlessllm-init0"]["ramp_s"] / lam_s,
            "ramp_ratio_fig12start": res["serverlessllm-fig12start"]["ramp_s"] / lam_s,
            "ramp_ratio_init0_one_batch": res["serverlessllm-init0"]["ramp_s"]
            / res["lambdascale-one-batch"]["ramp_s"],
        }
    return out


def fig10(start_s: float) -> dict:
    return {
        "models": _scaling("fig10", "all", lambda r: r, start_s),
        "serverlessllm_start_s": start_s,
        "paper": "2x to over 4x",
    }


def fig11(start_s: float) -> dict:
    return {
        "models": _scaling("fig11", "pinned-one", lambda r: 0, start_s),
        "serverlessllm_start_s": start_s,
        "paper": "3.75x to 11.4x",
    }


def fig8() -> dict:
    out: dict = {}
    for nodes in (4, 8, 12):
        out[str(nodes)] = {}
        for name in ("lambdascale", "faasnet", "nccl"):
            cfg = replace(system_config(name), max_sources=1)
            arrivals: dict[tuple[int, int], float] = {}
            isolated_multicast(TB1, "llama2-13b", cfg, nodes, 1, arrivals)
            per_node = {
                label: sorted(t for (n, _), t in arrivals.items() if n == node)
                for label, node in (("A", 1), ("B", nodes - 1))
            }
            out[str(nodes)][name] = {
                "arrival_s": per_node,
                "first_s": min(v[0] for v in per_node.values()),
                "last_s": max(v[-1] for v in per_node.values()),
            }
    last = {n: {s: v["last_s"] for s, v in d.items()} for n, d in out.items()}
    return {
        "nodes": out,
        "last_block_s": last,
        "faasnet_tail_growth_4_to_12": last["12"]["faasnet"] / last["4"]["faasnet"],
        "lambdascale_tail_growth_4_to_12": last["12"]["lambdascale"] / last["4"]["lambdascale"],
        "nccl_first_block_s": out["12"]["nccl"]["first_s"],
        "lambdascale_first_block_s": out["12"]["lambdascale"]["first_s"],
    }


def measured_overhead_s() -> float:
    """Per plan step, what the runtime's multicast took beyond the plan's optimum
    (benchmarks/results/scaleout/multicast.json: real bytes between agents on loopback)."""
    doc = json.loads(MULTICAST_JSON.read_text())
    b = doc["strategies"]["binomial"]
    return (b["complete_s"] - b["optimal_s"]) / b["plan_steps"]


def fig18() -> dict:
    overhead = measured_overhead_s()
    size = load_model("llama2-13b").total_bytes
    curves = {}
    for label, o in (("measured_overhead", overhead), ("no_overhead", 0.0)):
        settings = BlockCountSettings(size, 12, 1, 64, "binomial", Cluster.uniform(12, 400.0), o)
        curves[label] = {b: completion_s(settings, b) for b in (8, 16, 24, 32, 48)}
    best = min(curves["measured_overhead"], key=curves["measured_overhead"].get)
    return {
        "transfer_overhead_s": overhead,
        "overhead_source": "benchmarks/results/scaleout/multicast.json (binomial, 8 agents, 16 "
        "blocks): (complete_s - optimal_s) / plan_steps",
        "complete_s": curves,
        "best_blocks": best,
        "b8_over_b16": curves["measured_overhead"][8] / curves["measured_overhead"][16],
        "b48_over_b16": curves["measured_overhead"][48] / curves["measured_overhead"][16],
    }


def report_rows(doc: dict) -> list[dict]:
    """The REPORT.md rows these figures give (`report.py`)."""
    f8, f10, f11, f18 = doc["fig8"], doc["fig10"], doc["fig11"], doc["fig18"]
    last12 = f8["last_block_s"]["12"]
    r10 = {m: v["ramp_ratio"] for m, v in f10["models"].items()}
    r10z = {m: v["ramp_ratio_init0"] for m, v in f10["models"].items()}
    r10d = {m: v["ramp_ratio_fig12start"] for m, v in f10["models"].items()}
    r11d = {m: v["ramp_ratio_fig12start"] for m, v in f11["models"].items()}
    start = f10["serverlessllm_start_s"]
    r11 = {m: v["ramp_ratio"] for m, v in f11["models"].items()}
    r11z = {m: v["ramp_ratio_init0"] for m, v in f11["models"].items()}
    r10o = {m: v.get("ramp_ratio_init0_one_batch", float("nan")) for m, v in f10["models"].items()}

    def fmt(d: dict) -> str:
        return " / ".join(f"{v:.2f}x" for v in d.values())

    return [
        row(
            PAPER,
            "Fig. 8",
            "block arrival CDF (13B, 4/8/12 nodes): λScale's blocks arrive close together, "
            "NCCL's first block late (group set-up), FaaSNet's tail grows with N",
            "no number",
            f"last block at 12 nodes: λScale {last12['lambdascale']:.2f} s, NCCL "
            f"{last12['nccl']:.2f} s, FaaSNet {last12['faasnet']:.2f} s; FaaSNet tail 4->12 "
            f"nodes x{f8['faasnet_tail_growth_4_to_12']:.2f}, λScale "
            f"x{f8['lambdascale_tail_growth_4_to_12']:.2f}; NCCL first block "
            f"{f8['nccl_first_block_s']:.3f} s vs λScale {f8['lambdascale_first_block_s']:.3f} s",
            ordering=last12["lambdascale"] < min(last12["nccl"], last12["faasnet"])
            and f8["faasnet_tail_growth_4_to_12"] > f8["lambdascale_tail_growth_4_to_12"]
            and f8["nccl_first_block_s"] > f8["lambdascale_first_block_s"],
            cause="λScale's blocks land first and last at every size and NCCL's first block "
            "waits for its group set-up, as the paper says; FaaSNet's tail does not grow "
            "faster than λScale's: in the flow model each binary-tree level adds one block "
            f"time, as each binomial doubling does (4 -> 12 nodes: FaaSNet +"
            f"{last12['faasnet'] - f8['last_block_s']['4']['faasnet']:.3f} s, λScale +"
            f"{last12['lambdascale'] - f8['last_block_s']['4']['lambdascale']:.3f} s); the "
            "paper's FaaSNet loses active senders at the tree's bottom, which a tree whose "
            "nodes forward at full link rate does not.",
        ),
        row(
            PAPER,
            "Fig. 10",
            "scaling via the local cache: λScale reaches peak throughput 2x to over 4x "
            "sooner than ServerlessLLM (7B/13B k=8 of 12, 70B k=2 of 4)",
            "2-4x",
            f"ramp S-LLM / λScale 7B / 13B / 70B with S-LLM's start derived from Fig. 12 "
            f"({start:.1f} s): {fmt(r10d)}; shipped 0.5 s: {fmt(r10)}; 0: {fmt(r10z)}",
            ordering=min(r10d.values()) > 1,
            sim_range=(min(r10d.values()), max(r10d.values())),
            paper_range=(2.0, 4.0),
            cause=sllm_start_cause(start, fmt(r10), fmt(r10z), fmt(r10o))
            + f" With the derived start 7B overshoots ({r10d['llama2-7b']:.1f}x): its load "
            "from host memory takes about 0.2 s, so the start is most of ServerlessLLM's "
            "ramp there.",
        ),
        row(
            PAPER,
            "Fig. 11",
            "cold start (one host copy, k=1): λScale 3.75x to 11.4x faster than "
            "ServerlessLLM (SSD on the other nodes)",
            "3.75-11.4x",
            f"ramp S-LLM / λScale 7B / 13B / 70B with S-LLM's start derived from Fig. 12 "
            f"({start:.1f} s): {fmt(r11d)}; shipped 0.5 s: {fmt(r11)}; 0: {fmt(r11z)}",
            ordering=min(r11z.values()) > 1,
            sim_range=(min(r11d.values()), max(r11d.values())),
            paper_range=(3.75, 11.4),
        ),
        row(
            PAPER,
            "Fig. 18",
            "multicast latency vs block count (13B, 12 nodes): 16 blocks the fastest",
            "best B = 16",
            f"best B = {f18['best_blocks']} (per-transfer overhead "
            f"{f18['transfer_overhead_s'] * 1e3:.1f} ms measured on the runtime); B=8 "
            f"{f18['b8_over_b16']:.2f}x, B=48 {f18['b48_over_b16']:.2f}x B=16's time",
            ordering=f18["b8_over_b16"] > 1 and f18["b48_over_b16"] > 1,
            sim_value=float(f18["best_blocks"]),
            paper_value=16.0,
        ),
    ]


def draw(doc: dict) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(21, 4))
    for name, v in doc["fig8"]["nodes"]["12"].items():
        t = v["arrival_s"]["B"]
        ax[0].plot(t, np.linspace(0, 1, len(t)), label=name)
    ax[0].set(title="Fig. 8: block arrivals, node B, 12 nodes", xlabel="s", ylabel="CDF")
    for i, key in enumerate(("fig10", "fig11")):
        for model, v in doc[key]["models"].items():
            for sys_name in ("lambdascale", "serverlessllm"):
                c = smooth(np.array(v["systems"][sys_name]["rate_curve"]), SMOOTH_BINS)
                ls = "-" if sys_name == "lambdascale" else "--"
                ax[i + 1].plot(np.arange(len(c)) * STEP_S, c, ls, label=f"{model} {sys_name}")
        ax[i + 1].set(title=f"{key}: token rate (0.5-s mean)", xlabel="s", ylabel="tokens/s")
        ax[i + 1].legend(fontsize=6)
    for label, c in doc["fig18"]["complete_s"].items():
        ax[3].plot(list(c), list(c.values()), "o-", label=label)
    ax[3].set(title="Fig. 18: 13B to 12 nodes", xlabel="blocks", ylabel="complete (s)")
    for a in (ax[0], ax[3]):
        a.legend(fontsize=7)
    return fig


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start_s = sllm_start_from_fig12()
    doc = {"fig8": fig8(), "fig18": fig18(), "fig10": fig10(start_s), "fig11": fig11(start_s)}
    write("lambdascale_figs", doc, draw(doc))


if __name__ == "__main__":
    sys.exit(run_main(main))
