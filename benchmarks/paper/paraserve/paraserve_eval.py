"""ParaServe §8.3 (end-to-end TTFT SLO attainment), §8.4 (pipeline consolidation:
scale-down and scale-up) and §8.5 (brownfield cold starts) in the simulator.

- §8.3: scenario `paraserve-e2e` (384 models: 3 applications x Llama-2 7B/13B x 64,
  Table 2 SLOs, a Gamma process per model, testbed (ii)); CV 2/4/8 at 0.6 req/s and
  0.3/1.2/2.4 req/s at CV 8 (2.4: a heavier load, where the V100s run short). Headline:
  ParaServe's TTFT SLO attainment over the best baseline's (paper: up to 1.74x), serverless
  vLLM and ServerlessLLM; beside it the same ParaServe with every worker on whole GPUs
  (`SimSettings.fractional_gpus` False: low-memory workers holding 1/s of one GPU are
  issue 18's fix), SLO attainment per application (Fig. 12), and ServerlessLLM with other
  engine start-ups (the scenario's §8.1 S-LLM starts in 6.8 s beside its load, §8.2's
  lower bound; 0.5 s after the load, 4.0 s and 10 s beside it show how much the ordering
  rests on that number; which of them §8.2 allows: `sllm_start_check`).
- §8.4 scale-down: one cold request (512 in, 512 out), Llama-2 13B on the V100 servers
  of testbed (i), a 4-worker group with the §6.1 consolidation vs serving as a group for
  life, as the paper deploys it: workers at the default quarter quota (§4.1.1), the
  consolidated 13B on one V100 (§8.1); headline: end-to-end generation time, without /
  with (paper 2.29x); the V100 decodes at Table 1's warm TPOT (the profile's); whole
  V100s and slower stage hops beside it.
- §8.4 scale-up: 128 requests at once (512/512), batch 8 per worker (a group of w workers
  keeps w micro-batches of 8 in flight), 16 V100 GPUs, groups of 4 vs 1 worker;
  13B on one V100 (§8.1), as the paper deploys it; headline: mean TTFT 1 / 4 (paper
  1.87x) and TPOT 4 / 1 (1.08-1.19x); beside it 13B on the two V100s our fit rule gives
  it, and one fetch per server.
- §8.5 brownfield: `paraserve_brownfield.py` (ParaServe without the node prefetcher, as
  §8.5 deploys it; paper 2.6x).
- `sllm_start_check` (`paraserve_checks.py`): §8.2's sentence on ServerlessLLM with cached
  models against ParaServe's single worker, measured under each S-LLM start §8.3 varies.
Run: python benchmarks/paper/paraserve/paraserve_eval.py (about 40 s on one core);
`--only PART` (e2e, scale_down, scale_up, brownfield, sllm_start_check; repeatable) reruns
those parts into the existing JSON.
"""

import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows

from common import only_parts, ratio, read, run, run_main, run_scenario, write
from paraserve_brownfield import brownfield
from paraserve_checks import SLLM_STARTS, TABLE1_TPOT_S, simulated_tpot_s, sllm_start_check

from surge.policy.paraserve.gpu_share import pipeline_speed
from surge.policy.slo import Slo
from surge.policy.systems import system_config
from surge.sim.hardware import cluster_from_spec, cluster_spec, gpu_profile
from surge.sim.instance_factory import kv_capacity_tokens
from surge.sim.metrics import slo_met, tpot_s, ttft_s
from surge.sim.models import load_model
from surge.sim.scenario import load_scenario
from surge.sim.scenario_traffic import build_trace
from surge.sim.settings import SimSettings
from surge.traces.request import make_trace

log = logging.getLogger("paraserve_eval")
BASELINES = ("serverless-vllm", "serverlessllm")
KEYS = ("slo_attainment", "ttft_mean_s", "ttft_p90_s", "gpu_seconds", "cache_hits", "cache_misses")
LOOSE = Slo(1000.0, 10.0)
"""§8.4 measures latency, not attainment."""


def _with_gamma(scn, rate_rps: float, cv: float):
    per_model = rate_rps / sum(g.count for g in scn.groups)
    groups = []
    for g in scn.groups:
        spec = g.arrivals.trace
        opts = dict(p.split("=") for p in spec.removeprefix("gamma:").split(","))
        opts.update(rate=f"{per_model:.8g}", cv=f"{cv:g}")
        burn = 20 * cv * cv / per_model / 64 if cv > 1 else 20 / per_model
        opts["duration"] = f"{burn + (scn.duration_s or 600):.0f}"
        new = "gamma:" + ",".join(f"{k}={v}" for k, v in opts.items())
        groups.append(replace(g, arrivals=replace(g.arrivals, trace=new, start_s=burn)))
    return replace(scn, groups=tuple(groups))


def _by_application(res, settings) -> dict:
    """SLO attainment per application (Fig. 12): model names are `chat-13b/7` etc."""
    met = slo_met(res, settings)
    app = np.array([n.split("/")[0] for n in res.model_names])[res.model_index]
    return {a: float(met[app == a].mean()) for a in sorted(set(app))}


def e2e() -> dict:
    base = load_scenario("paraserve-e2e")
    # 2.4 req/s: a heavier load, where V100s run short (fractional vs whole GPUs there)
    points = [(0.6, cv) for cv in (2.0, 4.0, 8.0)] + [(r, 8.0) for r in (0.3, 1.2, 2.4)]
    rows = []
    for rate, cv in points:
        scn = _with_gamma(base, rate, cv)
        trace = build_trace(scn)
        row: dict = {"rate_rps": rate, "cv": cv, "requests": trace.num_requests}
        for name in scn.systems:
            s, res = run_scenario(scn, trace, name)
            row[name] = {k: s[k] for k in KEYS}
            row[name]["by_application"] = _by_application(res, scn.settings(name))
        # S-LLM's engine start (§8.1; the scenario's 6.8 s is §8.2's lower bound) varied:
        # before (0.5 s after the load), serverless vLLM's 4.0 s and 10 s, beside the load
        # (which of them §8.2's sentence allows: `sllm_start_check`)
        sllm = scn.system("serverlessllm")
        row["serverlessllm_start_sensitivity"] = {}
        for label, init_s, overlap in SLLM_STARTS:
            cfg = replace(sllm, init_s=init_s, init_overlaps_load=overlap)
            s, _ = run(trace, scn.settings("serverlessllm"), cfg)
            row["serverlessllm_start_sensitivity"][label] = {
                "slo_attainment": s["slo_attainment"],
                "paraserve_ratio": ratio(row["paraserve"]["slo_attainment"], s["slo_attainment"]),
            }
        # the same ParaServe with every worker on whole GPUs (before issue 18's fix)
        s, _ = run(trace, scn.settings("paraserve", fractional_gpus=False), scn.system("paraserve"))
        row["paraserve_whole_gpus"] = {k: s[k] for k in KEYS}
        row["fractional_vs_whole"] = {
            "slo_attainment": ratio(row["paraserve"]["slo_attainment"], s["slo_attainment"]),
            "gpu_seconds": ratio(row["paraserve"]["gpu_seconds"], s["gpu_seconds"]),
        }
        best = max(row[b]["slo_attainment"] for b in BASELINES)
        row["ratio_vs_best_baseline"] = ratio(row["paraserve"]["slo_attainment"], best)
        for b in BASELINES:
            row[f"ratio_vs_{b}"] = ratio(
                row["paraserve"]["slo_attainment"], row[b]["slo_attainment"]
            )
        rows.append(row)
    return {
        "rows": rows,
        "max_ratio_vs_best_baseline": max(r["ratio_vs_best_baseline"] for r in rows),
        "max_ratio_vs_any_baseline": max(max(r[f"ratio_vs_{b}"] for b in BASELINES) for r in rows),
        "paper": {"max_ratio": 1.74},
    }


def _v100_only(nic_gbps: float = 16.0):
    """Testbed (i)'s V100 servers (§8.4), their NICs at `nic_gbps` (16: §8.1)."""
    spec = cluster_spec("paraserve-1")
    v100 = [{**g, "nic_gbps": nic_gbps} for g in spec["groups"] if g["gpu"] == "V100"]
    return cluster_from_spec(f"paraserve-1/V100-{nic_gbps:g}gbps", {"groups": v100})


SCALE_DOWN_HOPS_S = (0.01, 0.02)
"""Counterfactual stage hops for §8.4 scale-down: the paper's pipeline crosses 16 Gb/s TCP
between GPU servers (§4.1's t_n); the shipped hop is 1 ms."""


def _scale_down_once(
    hop_s: float | None = None,
    pipeline_speed: float = 1.0,
    kv_memory_fraction: float = 0.9,
) -> dict:
    """`pipeline_speed`: the 4-worker group's compute relative to whole GPUs;
    `kv_memory_fraction` 1.0 lets 13B fit one V100 (so the consolidated worker is one)."""
    one = make_trace("one", [0.0], [512], [512])
    out = {}
    for mode in ("predictor", "none"):
        cfg = replace(
            system_config("paraserve"), group_sizing="fixed", pipeline_size=4, consolidation=mode
        )
        if hop_s is not None:
            cfg = replace(cfg, stage_hop_s=hop_s)
        settings = SimSettings(
            _v100_only(),
            ("llama2-13b",),
            "paraserve",
            slo=LOOSE,
            pipeline_speed=pipeline_speed,
            kv_memory_fraction=kv_memory_fraction,
        )
        _, res = run(one, settings, cfg)
        out[mode] = {
            "ttft_s": float(ttft_s(res)[0]),
            "generation_s": float(res.done_s[0] - res.arrival_s[0]),
        }
    return out


QUARTER_QUOTA = pipeline_speed((0.25,) * 4)
"""§4.1.1: "individual workers in a pipeline parallelism group allocate GPU memory
proportionally to their partitioned model size by default, and the amount of allocated
memory also determines the GPU computation quota": 4 workers at 1/4 each, the group at
Eq. 2's speed (`policy.paraserve.gpu_share.pipeline_speed`)."""
ONE_CARD = 1.0
"""`kv_memory_fraction` by which 13B fits one V100 (§8.1: "all evaluated models are able to
reside in single card"; our fit rule's 10% activation headroom and 10% KV floor of 0.9 of
32 GiB put it on two)."""


def scale_down() -> dict:
    """Headline as the paper deploys it: §8.4 sets only the group size (4), so its workers
    hold the default share (`QUARTER_QUOTA`), and the worker a consolidation leaves is one
    V100 (`ONE_CARD`). Whole V100s (the model before) and the hops are counterfactuals."""
    out = _scale_down_once(pipeline_speed=QUARTER_QUOTA, kv_memory_fraction=ONE_CARD)
    whole = _scale_down_once()
    hops = {}
    for hop in SCALE_DOWN_HOPS_S:
        h = _scale_down_once(hop)
        hops[f"{hop:g}"] = ratio(h["none"]["generation_s"], h["predictor"]["generation_s"])
    quarter = _scale_down_once(pipeline_speed=QUARTER_QUOTA)

    def gen(r: dict) -> float | None:
        return ratio(r["none"]["generation_s"], r["predictor"]["generation_s"])

    return {
        "deployment": "4 workers at a quarter quota each (§4.1.1 default), 13B on one V100",
        "systems": out,
        "generation_ratio": gen(out),
        "counterfactual_whole_gpus": {"systems": whole, "generation_ratio": gen(whole)},
        "counterfactual_quarter_quota_two_cards": gen(quarter),
        # the V100 profile decodes 13B at Table 1's warm TPOT (gpus.json, since 2026-11-29)
        "v100_tpot_s": {"simulated": simulated_tpot_s(), "table1": TABLE1_TPOT_S},
        "counterfactual_stage_hop_s": hops,
        "paper": {"generation_ratio": 2.29},
    }


def _scale_up_once(kv_memory_fraction: float = 0.9, nic_gbps_one_worker: float = 16.0) -> dict:
    """`nic_gbps_one_worker`: the V100 servers' NIC in the 1-worker run (16: §8.1)."""
    burst = make_trace("burst128", np.zeros(128), np.full(128, 512), np.full(128, 512))
    out = {}
    for size in (1, 4):
        cfg = replace(system_config("paraserve"), group_sizing="fixed", pipeline_size=size)
        settings = SimSettings(
            _v100_only(nic_gbps_one_worker if size == 1 else 16.0),
            ("llama2-13b",),
            "paraserve",
            slo=LOOSE,
            max_batch=8,  # per worker: a group keeps one micro-batch of 8 per stage in
            # flight (the simulator's default 2D pipeline, λScale §4.3 Fig. 6a; an int here
            # would be the CPU runtime's calibration model, one batch of 8 x size at a time)
            kv_memory_fraction=kv_memory_fraction,
        )
        _, res = run(burst, settings, cfg)
        ttft = ttft_s(res)
        out[f"workers{size}"] = {
            "ttft_mean_s": float(ttft.mean()),
            "ttft_first_s": float(ttft.min()),
            "ttft_last_s": float(ttft.max()),
            "tpot_mean_s": float(tpot_s(res).mean()),
        }
    out["ttft_ratio"] = ratio(out["workers1"]["ttft_mean_s"], out["workers4"]["ttft_mean_s"])
    out["tpot_ratio"] = ratio(out["workers4"]["tpot_mean_s"], out["workers1"]["tpot_mean_s"])
    return out


def scale_up() -> dict:
    """Headline as the paper deploys it: 13B on one V100 (§8.1; "128 concurrent requests
    (the maximum load for 16 V100 GPUs)" at batch 8 is one worker per GPU), KV admitted by
    prompt as vLLM does. Our fit rule's two V100s and a shared fetch are counterfactuals."""
    out = _scale_up_once(kv_memory_fraction=ONE_CARD)
    return {
        "deployment": "13B on one V100 (§8.1), KV admitted by prompt (vLLM)",
        "systems": {k: out[k] for k in ("workers1", "workers4")},
        "ttft_ratio": out["ttft_ratio"],
        "tpot_ratio": out["tpot_ratio"],
        "one_card_kv_tokens": kv_capacity_tokens(
            gpu_profile("V100").memory_bytes * ONE_CARD, load_model("llama2-13b")
        ),
        # 13B on the two V100s our fit rule gives it (10% activation headroom, 10% KV floor)
        "counterfactual_two_cards": _scale_up_once(),
        # each server's prefetcher (§5.1: one per GPU server) fetching the model once for
        # its 4 one-card workers, which the paper does not state: each 1-worker instance
        # then fetches at its server's whole 16 Gb/s (4 x 16 shared by 4)
        "counterfactual_one_card_shared_fetch": _scale_up_once(
            kv_memory_fraction=ONE_CARD, nic_gbps_one_worker=4 * 16.0
        ),
        "paper": {"ttft_ratio": 1.87, "tpot_ratio": "1.08-1.19"},
    }


def draw(doc: dict) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    rows = doc["e2e"]["rows"]
    labels = [f"{r['rate_rps']}/CV{r['cv']:g}" for r in rows]
    x = np.arange(len(rows))
    for i, name in enumerate(("paraserve", "paraserve_whole_gpus", *BASELINES)):
        ax[0].bar(x + (i - 1.5) * 0.2, [r[name]["slo_attainment"] for r in rows], 0.2, label=name)
    ax[0].set_xticks(x, labels)
    ax[0].set(title="§8.3 TTFT SLO attainment (req/s / CV)", ylim=(0, 1))
    ax[0].legend(fontsize=8, loc="lower left")
    heads = {
        "§8.4 down": doc["scale_down"]["generation_ratio"],
        "§8.4 up": doc["scale_up"]["ttft_ratio"],
        "§8.5": doc["brownfield"]["ttft_ratio"],
    }
    paper = [2.29, 1.87, 2.6]
    xs = np.arange(3)
    ax[1].bar(xs - 0.2, list(heads.values()), 0.4, label="simulated")
    ax[1].bar(xs + 0.2, paper, 0.4, label="paper")
    ax[1].set_xticks(xs, list(heads))
    ax[1].set(title="ParaServe speedups")
    ax[1].legend()
    return fig


PARTS = {
    "e2e": e2e,
    "scale_down": scale_down,
    "scale_up": scale_up,
    "brownfield": brownfield,
    "sllm_start_check": sllm_start_check,
}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    only = only_parts(__doc__.splitlines()[0], tuple(PARTS), None)
    doc = {}
    if only:
        doc = {k: v for k, v in read("paraserve_eval").items() if k != "machine"}
    for name, fn in PARTS.items():
        if not only or name in only:
            log.info("running %s", name)
            doc[name] = fn()
    write("paraserve_eval", doc, draw(doc))


if __name__ == "__main__":
    sys.exit(run_main(main))
