"""λScale under a burst: TTFT scaling via GDR (Fig. 12) and via the local cache (Fig. 13),
Llama-2 13B on Testbed1 (12 nodes, one H800 each).

- Fig. 12: K warm instances hold the model on GPU, then 50 requests arrive at once;
  λScale, FaaSNet and NCCL scale out over GDR from the GPU copies, ServerlessLLM-SSD loads
  from each node's SSD. Headline: the time until all 50 requests have their first token
  (paper: λScale 1.1 s, 2x / 1.4x / 8x faster than FaaSNet / NCCL / ServerlessLLM).
- Fig. 13: the same burst "under the same setup used in Fig. 10" (§7.4): R = 4 nodes hold
  the model on GPU and the other k = 8 load it from their own host memory (§7.3, N = R + k),
  both systems; headline: p90 TTFT, ServerlessLLM over λScale (1.63x).
Fig. 16 (k-way transmission, a throughput ramp) is lambdascale_kway.py.
Run: python benchmarks/paper/lambdascale/lambdascale_bursts.py (about 10 s).
"""

import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows

from common import ratio, run, run_main, write
from rows import row

from surge.policy.systems import system_config
from surge.sim.hardware import cluster_spec
from surge.sim.metrics import ttft_s
from surge.sim.models import load_model
from surge.sim.settings import SimSettings
from surge.traces.request import make_trace

log = logging.getLogger("lambdascale_bursts")
CLUSTER, MODEL = "lambdascale-testbed1", "llama2-13b"
MAX_BATCH = 8
"""Sequences per instance: the burst must exceed the warm instances' capacity, else the
router hands every request to them at once and nothing scales (the paper's runs push
RPS until it must)."""
RAMP_SHARE = 0.8
"""A ramp ends when the token rate (averaged over SMOOTH_BINS) first reaches this share of
the best rate any system reaches on the same load (the full cluster serving); λScale
Fig. 10, 11 (lambdascale_figs.py) and 16."""
SMOOTH_BINS = 5
STEP_S = 0.1


def burst(n: int, input_tokens: int = 1024, output_tokens: int = 64):
    """`n` requests at t = 0."""
    return make_trace(f"burst{n}", np.zeros(n), np.full(n, input_tokens), np.full(n, output_tokens))


def stress(rate_rps: float, duration_s: float, burst: int) -> object:
    """`burst` requests at t = 0, then `rate_rps` for `duration_s` (1024 in, 64 out): more
    than the cluster serves, so the autoscaler asks for every node at once (Fig. 10/11)."""
    t = np.concatenate([np.zeros(burst), np.arange(int(rate_rps * duration_s)) / rate_rps])
    return make_trace("stress", t, np.full(len(t), 1024), np.full(len(t), 64))


def sim_run(trace, cfg, warm: int, micro: int | None = None, nodes: int | None = None) -> tuple:
    """(summary, SimResult). `micro`: micro-batches per execution pipeline (None: one per
    stage, λScale §4.3); `nodes`: instances held from the start (None: the autoscaler sizes
    the scale-out)."""
    settings = SimSettings(
        CLUSTER,
        (MODEL,),
        cfg.name,
        warm_instances=warm,
        max_batch=MAX_BATCH,
        pipeline_micro_batches=micro,
        model_replicas=() if nodes is None else ((MODEL, nodes),),
    )
    return run(trace, settings, cfg)


def _one(
    trace, name: str, cfg, warm: int, micro: int | None = None, nodes: int | None = None
) -> dict:
    """One run's summary, time until every request has its first token and TTFT CDF."""
    summary, res = sim_run(trace, cfg, warm, micro, nodes)
    t = ttft_s(res)
    done = res.done_s >= 0
    early = res.output_tokens[done & (res.done_s <= 5.0)].sum()
    return {
        **summary,
        "all_first_token_s": float(t.max()) if len(t) else None,
        "tokens_in_5s": int(early),
        "ttft_cdf_s": np.sort(t).tolist(),
    }


def sllm_start_from_fig12() -> float:
    """ServerlessLLM's engine start as λScale's own Fig. 12 implies it (the paper gives none;
    ours ships 0.5 s): the start that makes ServerlessLLM-SSD serve all 50 requests at the
    paper's 8x λScale's 1.1 s; a start adds to that time one for one, so it is 8.8 s minus
    the time with none."""
    sllm_ssd = replace(system_config("serverlessllm"), host_cache="none", init_s=0.0)
    at0 = _one(burst(50), "serverlessllm", sllm_ssd, 1)["all_first_token_s"]
    return max(8.0 * 1.1 - at0, 0.0)


def fig12(warm: int = 1) -> dict:
    trace = burst(50)
    sllm_ssd = replace(system_config("serverlessllm"), host_cache="none")
    out = {
        "lambdascale": _one(trace, "lambdascale", system_config("lambdascale"), warm),
        "faasnet": _one(trace, "faasnet", system_config("faasnet"), warm),
        "nccl": _one(trace, "nccl", system_config("nccl"), warm),
        "serverlessllm-ssd": _one(trace, "serverlessllm", sllm_ssd, warm),
    }
    lam = out["lambdascale"]["all_first_token_s"]
    # counterfactuals, one assumption each: FaaSNet's tree forwarding the whole model
    # (store and forward) instead of 16 blocks; NCCL's group set-up at 0.3 s ("up to
    # hundreds of milliseconds", λScale §7.2) instead of 0.1 s
    faasnet_whole = replace(system_config("faasnet"), num_blocks=1)
    nccl_slow = replace(system_config("nccl"), group_setup_s=0.3)
    counter = {
        "faasnet_whole_model": _one(trace, "faasnet", faasnet_whole, warm),
        "nccl_group_setup_0.3s": _one(trace, "nccl", nccl_slow, warm),
    }
    return {
        "systems": out,
        "speedup": {k: ratio(v["all_first_token_s"], lam) for k, v in out.items()},
        "counterfactual_speedup": {
            k: ratio(v["all_first_token_s"], lam) for k, v in counter.items()
        },
        "serverlessllm_init_derived_s": sllm_start_from_fig12(),
        "paper": {"lambdascale_s": 1.1, "faasnet": 2.0, "nccl": 1.4, "serverlessllm-ssd": 8.0},
    }


FIG13_WARM, FIG13_LOCAL = 4, 8
"""λScale §7.4: Fig. 13 runs "under the same setup used in Fig. 10 (§7.3)": "R out of N
nodes have models loaded into their GPUs, while the remaining k nodes in the cluster load
the model from the local host memory cache (N = R + k)", "k is fixed at 8 for Llama-2 7B
and 13B" (N = 12, Testbed1): every one of the k nodes loads, whatever the burst needs."""


def fig13(derived_init_s: float | None = None) -> dict:
    """`derived_init_s`: S-LLM's engine start as Fig. 12 implies it (a second counterfactual)."""
    trace = burst(50)
    lam = replace(system_config("lambdascale"), host_cache="all")
    sllm = replace(system_config("serverlessllm"), host_cache="all")
    warm, nodes = FIG13_WARM, FIG13_WARM + FIG13_LOCAL
    out = {
        "lambdascale": _one(trace, "lambdascale", lam, warm, nodes=nodes),
        "serverlessllm": _one(trace, "serverlessllm", sllm, warm, nodes=nodes),
        # S-LLM's 0.5-s engine start is not in the λScale paper: at 0 (its most favourable
        # bound) the ordering must still hold for it not to rest on that constant
        "serverlessllm-init0": _one(
            trace, "serverlessllm", replace(sllm, init_s=0.0), warm, nodes=nodes
        ),
        # counterfactual: one batch at a time through a pipeline's stages (not §4.3's 2D)
        "lambdascale-one-batch": _one(trace, "lambdascale", lam, warm, micro=1, nodes=nodes),
    }
    if derived_init_s is not None:
        out["serverlessllm-init-fig12"] = _one(
            trace, "serverlessllm", replace(sllm, init_s=derived_init_s), warm, nodes=nodes
        )
        # counterfactual: the autoscaler sizing the scale-out to the burst (the scenario
        # before 2026-11-28: 3 of the k = 8 nodes loaded)
        out["lambdascale-burst-sized"] = _one(trace, "lambdascale", lam, warm)
        out["serverlessllm-init-fig12-burst-sized"] = _one(
            trace, "serverlessllm", replace(sllm, init_s=derived_init_s), warm
        )
    derived = out.get("serverlessllm-init-fig12")
    sized = out.get("serverlessllm-init-fig12-burst-sized")
    return {
        "local_loads": out["lambdascale"]["cache_hits"],
        "p90_ratio_burst_sized": None
        if sized is None
        else ratio(sized["ttft_p90_s"], out["lambdascale-burst-sized"]["ttft_p90_s"]),
        "p90_ratio_serverlessllm_init_fig12": None
        if derived is None
        else ratio(derived["ttft_p90_s"], out["lambdascale"]["ttft_p90_s"]),
        "systems": out,
        "p90_ratio_serverlessllm": ratio(
            out["serverlessllm"]["ttft_p90_s"], out["lambdascale"]["ttft_p90_s"]
        ),
        "p90_ratio_serverlessllm_init0": ratio(
            out["serverlessllm-init0"]["ttft_p90_s"], out["lambdascale"]["ttft_p90_s"]
        ),
        "p90_ratio_serverlessllm_init0_one_batch": ratio(
            out["serverlessllm-init0"]["ttft_p90_s"], out["lambdascale-one-batch"]["ttft_p90_s"]
        ),
        "paper": {"p90_ratio_serverlessllm": 1.63},
    }


SSD_70B_LOAD_OVER_S = 30.0
"""λScale §2.3 (FaaScale §2.3), measured on its own testbed (§7.1): "loading a Llama-70B
model from an SSD to a GPU takes over 30 seconds even with optimized implementations"."""


def sllm_start_floor_s() -> float:
    """What §2.3's "over 30 seconds" leaves beyond Table 1's SSD read (5 GB/s) for 70B: a
    lower bound on what a load from SSD costs besides bandwidth on λScale's testbed (an
    engine start or a slower read: the text does not split it), not a start."""
    gbps = cluster_spec("lambdascale-testbed2")["groups"][0]["ssd_gbps"]
    return SSD_70B_LOAD_OVER_S - load_model("llama2-70b").total_bytes * 8 / (gbps * 1e9)


def sllm_start_cause(
    derived_s: float, shipped: str, at0: str, one_batch: str, leads_at_zero: bool
) -> str:
    """The cause of λScale Fig. 10 and 13 where they miss (lambdascale_figs.py uses it
    too): the ratios at ServerlessLLM's derived start, the shipped one, 0, and at 0 with
    one batch at a time through a pipeline; whether λScale still leads at 0
    (`leads_at_zero`: every ratio at 0 above 1); and §2.3's bound on an SSD load's extra
    time."""
    floor = sllm_start_floor_s()
    meets = [f"{v:.1f} s" for v in (derived_s, 0.5, 0.0) if v >= floor]
    order = (
        "The ordering does not rest on it: at 0 λScale still leads through its warm-start "
        "execution pipelines (λScale §5, FaaScale §5), whose stages each work on their own "
        "batch (§4.3 Fig. 6a)."
        if leads_at_zero
        else f"The ordering rests on it too: at 0 λScale does not lead ({at0})."
    )
    return (
        "Judged with ServerlessLLM's engine start derived from λScale Fig. 12 "
        f"({derived_s:.1f} s: S-LLM-SSD serving 50 requests in 8x λScale's 1.1 s; the λScale "
        "paper gives no start, ours ships an unsourced 0.5 s), on which the ratio rests: "
        f"0.5 s gives {shipped}, 0 gives {at0}. {order} Counterfactual: "
        "one batch at a time through a pipeline's stages (the simulator's model before "
        f"this fix) gives {one_batch} at 0. The one number on λScale's testbed (§2.3: 70B "
        '"from an SSD to a GPU takes over 30 seconds even with optimized implementations") '
        f"leaves more than {floor:.1f} s beyond Table 1's 5-GB/s read; of the starts run "
        f"({derived_s:.1f} s, 0.5 s, 0) {' and '.join(meets) or 'none'} "
        f"{'meets' if len(meets) == 1 else 'meet'} that bound (it bounds the start, it does "
        "not give it)."
    )


def report_rows(doc: dict) -> list[dict]:
    """REPORT.md rows (`report.py`)."""
    f12, f13 = doc["fig12"], doc["fig13"]
    sp = f12["speedup"]
    lam12 = f12["systems"]["lambdascale"]["all_first_token_s"]
    z = f13.get("p90_ratio_serverlessllm_init0")
    zd = f13.get("p90_ratio_serverlessllm_init_fig12")
    d_init = f12.get("serverlessllm_init_derived_s")
    cf, nan = f12.get("counterfactual_speedup", {}), float("nan")
    d12 = f12.get("serverlessllm_init_derived_s") or nan
    return [
        row(
            "λScale",
            "Fig. 12",
            "50 requests at once, 1 warm instance (13B, 12 nodes): all served in 1.1 s; "
            "FaaSNet 2x, NCCL 1.4x, ServerlessLLM-SSD 8x slower",
            "1.1 s; 2x / 1.4x / 8x",
            f"{lam12:.2f} s; FaaSNet {sp['faasnet']:.2f}x, NCCL {sp['nccl']:.2f}x, "
            f"S-LLM-SSD {sp['serverlessllm-ssd']:.2f}x",
            ordering=1 < sp["nccl"] < sp["faasnet"] < sp["serverlessllm-ssd"],
            pairs=(
                (lam12, 1.1),
                (sp["faasnet"], 2.0),
                (sp["nccl"], 1.4),
                (sp["serverlessllm-ssd"], 8.0),
            ),
            cause=f"λScale's own time matches ({lam12:.2f} vs 1.1 s) but the baselines are "
            "faster than the paper's, each for an assumption the paper does not state. "
            "FaaSNet: its binary tree forwards 16 blocks pipelined; forwarding the whole "
            f"model (store and forward) gives {cf.get('faasnet_whole_model', nan):.2f}x "
            '(paper 2x). NCCL: its group set-up is 0.1 s; at 0.3 s ("up to hundreds of '
            f'milliseconds", §7.2) {cf.get("nccl_group_setup_0.3s", nan):.2f}x (paper 1.4x). '
            "ServerlessLLM-SSD: its 40-Gb/s read plus the shipped, unsourced 0.5-s engine "
            f"start; the start λScale's own Fig. 12 implies ({d12:.1f} s) gives 8x by "
            "construction, so it is not a measurement.",
        ),
        row(
            "λScale",
            "Fig. 13",
            "scaling via the local cache (13B, 12 nodes: 4 warm, k = 8 load from host memory, "
            "§7.3's setup): p90 TTFT 1.63x below ServerlessLLM",
            "1.63x",
            (f"{zd:.2f}x with S-LLM's start derived from Fig. 12 ({d_init:.1f} s); " if zd else "")
            + f"{f13['p90_ratio_serverlessllm']:.2f}x with the shipped 0.5 s; "
            + (f"{z:.2f}x at 0" if z is not None else "start 0 not run"),
            ordering=None if zd is None else zd > 1,
            sim_value=zd,
            paper_value=1.63,
            cause=sllm_start_cause(
                d_init or 0.0,
                f"{f13['p90_ratio_serverlessllm']:.2f}x",
                f"{z:.2f}x" if z is not None else "not run",
                f"{f13.get('p90_ratio_serverlessllm_init0_one_batch', float('nan')):.2f}x",
                z is not None and z > 1,
            )
            + f" All k = 8 nodes load ({f13.get('local_loads')} host-memory loads), as §7.4 "
            'runs Fig. 13 "under the same setup used in Fig. 10" (§7.3: N = R + k); with the '
            "autoscaler sizing the scale-out to the 50-request burst (3 of the 8 load, the "
            "scenario before 2026-11-28) the ratio at the derived start was "
            f"{f13.get('p90_ratio_burst_sized') or nan:.2f}x.",
        ),
    ]


def draw(doc: dict) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for i, key in enumerate(("fig12", "fig13")):
        for name, d in doc[key]["systems"].items():
            cdf = d["ttft_cdf_s"]
            ax[i].plot(cdf, np.linspace(0, 1, len(cdf)), label=name)
        ax[i].set(title=key, xlabel="TTFT (s)", ylabel="CDF")
        ax[i].legend()
    return fig


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    doc = {}
    for name, fn in (
        ("fig12", fig12),
        ("fig13", lambda: fig13(doc["fig12"]["serverlessllm_init_derived_s"])),
    ):
        log.info("running %s", name)
        doc[name] = fn()
    write("lambdascale_bursts", doc, draw(doc))


if __name__ == "__main__":
    sys.exit(run_main(main))
