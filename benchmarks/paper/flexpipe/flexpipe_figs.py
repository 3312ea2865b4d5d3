"""FlexPipe Fig. 10 (tail stability), Fig. 11 (pipeline stall recovery), Fig. 13
(production prefill latency) and §9.6 (instance initialisation, always-on reservation) in the
simulator, on the paper's cluster (`flexpipe`: 82 A100s over 42 servers, 100 Gb/s), with the
§9 baselines as `benchmarks/systems/flexpipe_sim.py` deploys them.

- Fig. 10 (§9.2) and Fig. 11 (§9.3): Gamma arrivals at 20 QPS, CV 1 / 2 / 4, for §9.1's
  "complete 2-hour lifecycle" (7,200 s; 512 in, 128 out, Llama-2 7B). Fig. 10: P99
  end-to-end latency, ServerlessLLM over FlexPipe. Fig. 11: a stall starts when a
  request's latency exceeds 1.5x the run's P25 latency and ends at the first later request
  back within 1.2x (the paper's definition); recovery = the time between their arrivals.
  Median recovery per system: FlexPipe, AlpaServe (4-stage pipelines provisioned once for
  the peak: `provisioned-4`), ServerlessLLM (load then serve, autoscaled). Paper at CV 4:
  FlexPipe 9 ms, AlpaServe 16 ms, ServerlessLLM 50 ms (MuxServe and Tetris multiplex GPUs,
  which the simulator does not model).
- Fig. 13 (§9.5): `flexpipe_fig13.py` (each model against the system §9.5 names for it:
  ServerlessLLM for LLAMA-7B and BERT-21B, AlpaServe for WHISPER-9B and OPT-66B). Paper:
  6.43-24.38% lower, 17.32% on average.
- §9.6: instance initialisation of one cold start (a lone request's first token, cold minus
  warm) for FlexPipe's 4-stage group (§9's fine pipeline; its finest, 8 stages, and the
  stages its own scale-outs start at on Fig. 13's trace beside it) vs a whole-model
  instance (from host memory, the same engine start), the same models. Paper: 72% lower
  on average; always-on reservation 30% of peak (vs 75%): the GPUs FlexPipe holds 90% of
  the time in Fig. 10/11's CV-4 run over its peak (`always_held_over_peak`; the system
  keeps 30% of its peak groups ready, §9.1).
Run: python benchmarks/paper/flexpipe/flexpipe_figs.py (about 15 min at load ~8; needs
shared/traces), or piece by piece with --only init, --only fig11-cv4, ... (`PARTS`).
"""

import logging
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows
sys.path.insert(2, str(Path(__file__).resolve().parents[3]))  # benchmarks.systems

from common import only_parts, read, run, run_main, write
from flexpipe_fig13 import FIG13_MODELS, fig13, fig13_alpaserve, production_trace

from benchmarks.systems.flexpipe_sim import quick_release, run_one
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import system_config
from surge.sim.metrics import ttft_s
from surge.sim.settings import SimSettings, Slo
from surge.traces.request import make_trace

HERE = Path(__file__).resolve().parent
log = logging.getLogger("flexpipe_figs")
CLUSTER = "flexpipe"
KW = {
    "cluster": CLUSTER,
    "model": "llama2-7b",
    "rate_rps": 20.0,
    "duration_s": 600.0,
    "seed": 1,
    "slo": Slo(ttft_s=5.0, tpot_s=0.2),
    "fine_stages": 4,
    "input_tokens": 512,
    "output_tokens": 128,
}
"""§9's setting, as `flexpipe_cv.py` runs it."""
LIFECYCLE_S = 7200.0
"""§9.1: "All experiments used a baseline of 20 QPS across the complete 2-hour lifecycle":
Fig. 10 and 11 run this long, so ServerlessLLM's LRU host cache, empty at the start, is
warm for most of the run as in the paper (600 s, `KW`, left its first SSD loads most of its
tail)."""


def recovery_s(arrival_s: np.ndarray, latency_s: np.ndarray) -> list[float]:
    """Stall recoveries (§9.3): a stall starts at a request over 1.5x the P25 latency and
    ends at the next request back within 1.2x; seconds between their arrivals."""
    order = np.argsort(arrival_s)
    t, lat = arrival_s[order], latency_s[order]
    base = float(np.percentile(lat, 25))
    out, start = [], None
    for ti, li in zip(t, lat, strict=True):
        if start is None and li > 1.5 * base:
            start = ti
        elif start is not None and li <= 1.2 * base:
            out.append(float(ti - start))
            start = None
    return out


def _latency_run(variant: str, cv: float, **kw) -> dict:
    got = []
    summary = run_one(variant, cv, on_result=got.append, **{**KW, **kw})
    res = got[0]
    done = res.done_s >= 0
    rec = recovery_s(res.arrival_s[done], res.done_s[done] - res.arrival_s[done])
    return {
        "stalls": len(rec),
        "recovery_median_s": float(np.median(rec)) if rec else 0.0,
        "recovery_p90_s": float(np.percentile(rec, 90)) if rec else 0.0,
        "e2e_p99_s": summary["e2e_p99_s"],
        "gpus_peak": summary["gpus_peak"],
        # §9.6's always-on share: the GPUs held 90% of the time after the first minute
        "always_held_over_peak": summary["gpus_always_held"] / max(summary["gpus_peak"], 1),
    }


LIFE = {"duration_s": LIFECYCLE_S}


def fig11_cv(cv: float) -> dict:
    """Fig. 10 and 11 at one CV over §9.1's 2-hour lifecycle (about 4.5 min at load ~2)."""
    log.info("fig10/11 CV %g", cv)
    static = run_one("static-4", cv, **{**KW, **LIFE})
    groups = max(1, -(-static["gpus_peak"] // 4))
    return {
        "flexpipe": _latency_run("flexpipe", cv, **LIFE),
        "alpaserve": _latency_run("provisioned-4", cv, provisioned_groups=groups, **LIFE),
        "serverlessllm": _latency_run("load-then-serve", cv, **LIFE),
    }


def fig11_spread(cvs: list[str]) -> dict:
    """Fig. 10's counterfactual: FlexPipe spreading requests (least-loaded) instead of
    packing them onto the fewest pipelines (§7's reclaiming)."""
    return {
        cv: _latency_run(
            "flexpipe", float(cv), change=lambda c: replace(c, routing="least-loaded"), **LIFE
        )
        for cv in cvs
    }


def fig11_other(cvs: list[str]) -> dict:
    """The remaining counterfactuals: FlexPipe at CV 1 / 2 / 4 releasing idle groups after
    2 s with no always-ready floor (as shipped before §9.1 / §9.4's reclamation); and
    Fig. 10 over 600 s (ServerlessLLM's first loads from SSD are then most of its tail)."""
    quick = {cv: _latency_run("flexpipe", float(cv), change=quick_release, **LIFE) for cv in cvs}
    short = {
        cv: {name: _latency_run(name, float(cv)) for name in ("flexpipe", "load-then-serve")}
        for cv in cvs
    }
    return {"counterfactual_600s": short, "counterfactual_flexpipe_release_2s": quick}


FIG11_CVS = ("1", "2", "4")


def fig11() -> dict:
    """Fig. 10 and 11 over §9.1's 2-hour lifecycle, and their counterfactuals."""
    cvs = list(FIG11_CVS)
    return {
        "duration_s": LIFECYCLE_S,
        "by_cv": {cv: fig11_cv(float(cv)) for cv in cvs},
        **fig11_other(cvs),
        "counterfactual_flexpipe_least_loaded": fig11_spread(cvs),
        "paper_cv4_ms": {"flexpipe": 9, "alpaserve": 16, "serverlessllm": 50},
    }


def _init_at(stages: int) -> dict:
    """Initialisation of one cold start (cold minus warm first token) per model: a FlexPipe
    group of `stages` stages (each loads its share in parallel, §7) against a whole-model
    instance loading from host memory with FlexPipe's engine start (only the pipelined
    load differs)."""
    one = make_trace("one", [0.0], [512], [1])
    flex = replace(
        system_config("flexpipe"),
        flexpipe=FlexPipeSettings(stage_counts=(stages,), cv_targets=(0.0,)),
    )
    whole = replace(system_config("serverlessllm"), host_cache="all", init_s=flex.init_s)
    out = {}
    for model in FIG13_MODELS:
        res = {}
        for name, cfg in (("flexpipe", flex), ("serverlessllm", whole)):
            first = []
            for warm in (0, 1):  # cold minus warm first token: the initialisation alone
                settings = SimSettings(
                    CLUSTER, (model,), name, slo=Slo(1000.0, 10.0), warm_instances=warm
                )
                _, r = run(one, settings, cfg)
                first.append(float(ttft_s(r)[0]))
            res[name] = first[0] - first[1]
        res["reduction"] = 1 - res["flexpipe"] / res["serverlessllm"]
        out[model] = res
    return out


def _scale_out_stages() -> dict:
    """The stage counts FlexPipe's own new groups start at (Eq. 11/12 and `useful_stages`,
    as shipped) on Fig. 13's production trace, per model: {stages: groups}."""
    trace = production_trace()
    out = {}
    for model in (*FIG13_MODELS, "opt-66b"):
        _, res = run(trace, SimSettings(CLUSTER, (model,), "flexpipe"), system_config("flexpipe"))
        counts = Counter(n for t, n in res.endpoints_up.values() if t > 0)
        out[model] = {str(n): counts[n] for n in sorted(counts)}
    return out


def init_latency() -> dict:
    """§9.6: initialisation of one cold start, FlexPipe's group of §9's fine pipeline
    (`KW["fine_stages"]`, 4 stages; a lone request gives no CV, so Eq. 11 would pick one
    stage) vs a whole-model instance. Beside it, measured: the same at FlexPipe's finest
    granularity (the largest of its `stage_counts`), and the stage counts its own
    scale-outs start at on Fig. 13's production trace (§9.6 does not say at which
    granularity its production instances start)."""
    out = _init_at(KW["fine_stages"])
    finest = max(FlexPipeSettings().stage_counts)
    at_finest = _init_at(finest)
    return {
        "stages": KW["fine_stages"],
        "models": out,
        "mean_reduction": float(np.mean([v["reduction"] for v in out.values()])),
        "counterfactual_finest": {
            "stages": finest,
            "models": at_finest,
            "mean_reduction": float(np.mean([v["reduction"] for v in at_finest.values()])),
        },
        "scale_out_stages_production": _scale_out_stages(),
        "paper": {"init_reduction": 0.72, "always_on": 0.30, "static_always_on": 0.75},
    }


def draw(doc: dict) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4))
    cvs = list(doc["fig11"]["by_cv"])
    x = np.arange(len(cvs))
    for i, name in enumerate(("flexpipe", "alpaserve", "serverlessllm")):
        med = [doc["fig11"]["by_cv"][c][name]["recovery_median_s"] * 1e3 for c in cvs]
        ax[0].bar(x + (i - 1) * 0.27, med, 0.27, label=name)
    ax[0].set_xticks(x, [f"CV {c}" for c in cvs])
    ax[0].set(title="Fig. 11: median stall recovery", ylabel="ms")
    ax[0].legend()
    m = doc["fig13"]["models"]
    x = np.arange(len(m))
    for i, name in enumerate(("flexpipe", "serverlessllm")):
        ax[1].bar(
            x + (i - 0.5) * 0.4, [v[name]["ttft_mean_s"] for v in m.values()], 0.4, label=name
        )
    ax[1].set_xticks(x, list(m))
    ax[1].set(title="Fig. 13: mean TTFT, production trace", ylabel="s")
    ax[1].legend()
    m = doc["init"]["models"]
    for i, name in enumerate(("flexpipe", "serverlessllm")):
        ax[2].bar(x + (i - 0.5) * 0.4, [v[name] for v in m.values()], 0.4, label=name)
    ax[2].set_xticks(x, list(m))
    ax[2].set(title="§9.6: cold-start first token", ylabel="s")
    ax[2].legend()
    return fig


PARTS = (
    "init",
    "fig13",
    "fig13-alpaserve",
    "fig11-cv1",
    "fig11-cv2",
    "fig11-cv4",
    "fig11-spread",
    "fig11-other",
)
"""The pieces of a run (`--only` reruns some into the existing JSON; each under ~5 min)."""


def run_part(part: str, doc: dict) -> None:
    """Compute one of `PARTS` into `doc` (a full run's layout)."""
    if part == "init":
        doc["init"] = init_latency()
    elif part == "fig13":
        doc["fig13"] = fig13()
    elif part == "fig13-alpaserve":
        doc["fig13_alpaserve"] = fig13_alpaserve()
    elif part.startswith("fig11-cv"):
        cv = part[len("fig11-cv") :]
        doc["fig11"]["by_cv"][cv] = fig11_cv(float(cv))
    elif part == "fig11-spread":
        doc["fig11"]["counterfactual_flexpipe_least_loaded"] = fig11_spread(list(FIG11_CVS))
    else:
        doc["fig11"].update(fig11_other(list(FIG11_CVS)))


def last_run() -> dict:
    """The existing JSON without its machine line."""
    return {k: v for k, v in read("flexpipe_figs").items() if k != "machine"}


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    only = only_parts(__doc__.split("\n")[0], PARTS, argv)
    if only:
        mine = last_run()
        for part in [p for p in PARTS if p in only]:
            log.info("part %s", part)
            run_part(part, mine)
        # pieces run side by side in separate processes: merge into the JSON as it is now
        doc = last_run()
        for part in only:
            if part.startswith("fig11-cv"):
                cv = part[len("fig11-cv") :]
                doc["fig11"]["by_cv"][cv] = mine["fig11"]["by_cv"][cv]
            elif part in ("init", "fig13"):
                doc[part] = mine[part]
            elif part == "fig13-alpaserve":
                doc["fig13_alpaserve"] = mine["fig13_alpaserve"]
            elif part == "fig11-spread":
                key = "counterfactual_flexpipe_least_loaded"
                doc["fig11"][key] = mine["fig11"][key]
            elif part == "fig11-other":
                doc["fig11"].pop("counterfactual_cv4_flexpipe_holding", None)
                for key in ("counterfactual_600s", "counterfactual_flexpipe_release_2s"):
                    doc["fig11"][key] = mine["fig11"][key]
    else:
        doc = {"init": init_latency(), "fig13": fig13(), "fig11": fig11()}
        doc["fig13_alpaserve"] = fig13_alpaserve()
    write("flexpipe_figs", doc, draw(doc))


if __name__ == "__main__":
    sys.exit(run_main(main))
