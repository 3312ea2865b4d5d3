"""λScale Fig. 16 (§7.6, "Impacts of k-way transmission on throughput performance"):
λScale with k = 1, 2, 4 sources (k warm instances, §4.2's k-way transmission), Llama-2 13B
on Testbed1 (12 nodes, one H800 each; §7.1's defaults: §7.6 states no model or nodes).

§7.6: k=4 "achieves the fastest scaling", k=2 "scales more slowly", k=1 has "the slowest
scaling and the lowest overall throughput". Headline: the token rate over time under 100
requests at once (§7.6 states no load: the burst this figure ran with before it was read as
a ramp), its ramp (the time the rate first reaches RAMP_SHARE of the best peak of the three,
Fig. 10/11's metric) and its overall throughput (output tokens over the time to the last
one). Mean TTFT, which this row was judged on before 2026-11-29, stays as a secondary
number. Counterfactual: Fig. 10/11's stress load (§7.1: throughput "measures λScale's
ability to sustain high-load inference requests").
Run: python benchmarks/paper/lambdascale/lambdascale_kway.py (seconds).
"""

import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: common, rows

from common import ratio, run_main, write
from lambdascale_bursts import MAX_BATCH, RAMP_SHARE, SMOOTH_BINS, STEP_S, burst, sim_run, stress
from ramp import smooth, time_to_share, token_rate
from rows import row

from surge.policy.systems import system_config
from surge.sim.metrics import ttft_s

log = logging.getLogger("lambdascale_kway")


KWAY = (1, 2, 4)
"""λScale §7.1: "a k value ranging from {1, 2, 4}"; Fig. 16's λScale-Non-Reorder / Half-Reorder /
Net."""
RAMP_SHARES = (0.2, 0.5, RAMP_SHARE)
"""Shares of the best peak the Fig. 16 JSON records a ramp time for (the row judges
RAMP_SHARE, as Fig. 10/11; the others show where along the ramp k matters)."""


def _kway(trace, end_s: float | None = None) -> dict:
    """λScale with k = 1, 2, 4 sources (k warm instances, §4.2's k-way transmission) on
    `trace`: each k's token rate on one common timeline (to `end_s`, default the last
    token of the three), its ramp and its overall throughput (output tokens over the
    window: to its own last token when `end_s` is None)."""
    runs = {}
    for k in KWAY:
        cfg = replace(system_config("lambdascale"), max_sources=k)
        runs[f"k{k}"] = sim_run(trace, cfg, k)
    end = end_s or max(float(res.done_s.max()) for _, res in runs.values())
    rates = {n: token_rate(res, trace, STEP_S, end) for n, (_, res) in runs.items()}
    best = max(float(smooth(r, SMOOTH_BINS).max()) for _, r in rates.values())
    out = {}
    for n, (summary, res) in runs.items():
        times, rate = rates[n]
        by_share = {
            f"{q:.0%}": time_to_share(times, rate, q, SMOOTH_BINS, best) for q in RAMP_SHARES
        }
        window = end_s or float(res.done_s.max())
        served = res.done_s >= 0
        out[n] = {
            "ramp_s": by_share[f"{RAMP_SHARE:.0%}"] or end,  # never reached: the window
            "ramp_by_share_s": by_share,
            "peak_tokens_per_s": float(smooth(rate, SMOOTH_BINS).max()),
            "mean_tokens_per_s": float(res.output_tokens[served & (res.done_s <= window)].sum())
            / window,
            "last_token_s": float(res.done_s.max()),
            "first_pipeline_s": min(
                (t for t, _, kind, _ in res.scale_events if kind == "pipeline"), default=None
            ),
            "ttft_mean_s": summary["ttft_mean_s"],
            "ttft_p90_s": summary["ttft_p90_s"],
            "network_loads": res.network_loads,
            "rate_curve": rate[: int(10 / STEP_S)].round(1).tolist(),
            "ttft_cdf_s": np.sort(ttft_s(res)).tolist() if end_s is None else [],
        }
    return {"best_peak_tokens_per_s": best, "systems": out}


def fig16() -> dict:
    """λScale §7.6 Fig. 16 ("Impacts of k-way transmission on throughput performance"):
    the token rate over time for k = 1, 2, 4 under a 100-request burst (§7.6 states no
    load; ours), with the stress load of Fig. 10/11 (13B: 192 at once, then 200 RPS for
    30 s; §7.1: throughput "measures λScale's ability to sustain high-load inference
    requests") as a counterfactual."""
    doc = _kway(burst(100))
    ramp = {n: v["ramp_s"] for n, v in doc["systems"].items()}
    tput = {n: v["mean_tokens_per_s"] for n, v in doc["systems"].items()}
    ttft = {n: v["ttft_mean_s"] for n, v in doc["systems"].items()}
    return {
        "metric": f"ramp: first time the token rate ({SMOOTH_BINS * STEP_S:.1f}-s mean) "
        f"reaches {RAMP_SHARE:.0%} of the best peak of the three (Fig. 10/11's); overall "
        "throughput: output tokens over the time to the last one",
        **doc,
        "ordering_holds": ramp["k4"] < ramp["k2"] < ramp["k1"]
        and tput["k1"] < min(tput["k2"], tput["k4"]),
        "ramp_k1_over_k4": ratio(ramp["k1"], ramp["k4"]),
        "mean_ttft_k1_over_k4": ratio(ttft["k1"], ttft["k4"]),
        "stress_counterfactual": _kway(stress(200.0, 30.0, 12 * MAX_BATCH * 2), 30.0),
        "paper": {
            "ordering": "k=4 scales fastest, then k=2, then k=1; k=1 lowest overall throughput"
        },
    }


def fig16_row(f16: dict) -> dict:
    """Fig. 16's REPORT.md row: judged on the ramp and the overall throughput (§7.6), not
    on TTFT (kept as a secondary number)."""
    sy = f16["systems"]
    ramp = {n: v["ramp_s"] for n, v in sy.items()}
    tput = {n: v["mean_tokens_per_s"] for n, v in sy.items()}
    st = f16.get("stress_counterfactual", {}).get("systems", {})

    def per_k(d: dict, key: str, fmt: str) -> str:
        return " / ".join(format(d[f"k{k}"][key], fmt) for k in KWAY)

    last_first = " / ".join(f"{max(sy[f'k{k}']['ttft_cdf_s']):.2f}" for k in KWAY) + " s"
    share = {
        q: per_k({n: v["ramp_by_share_s"] for n, v in sy.items()}, q, ".2f") for q in ("20%", "50%")
    }
    stress_text = (
        f" Under Fig. 10/11's stress load (counterfactual; §7.1: throughput 'measures "
        "λScale's ability to sustain high-load inference requests'): ramp "
        f"{per_k(st, 'ramp_s', '.2f')} s, mean {per_k(st, 'mean_tokens_per_s', '.0f')} tokens/s "
        "over 30 s."
        if st
        else ""
    )
    return row(
        "λScale",
        "Fig. 16",
        "k-way transmission (13B, 12 nodes, 100 requests at once, k warm; §7.6 states no "
        "load): throughput over time, k=4 scales fastest, then k=2, then k=1 (also the "
        "lowest overall throughput)",
        "ordering only",
        f"ramp to {RAMP_SHARE:.0%} of the best peak k=1 / 2 / 4 {per_k(sy, 'ramp_s', '.2f')} s; "
        f"overall throughput {per_k(sy, 'mean_tokens_per_s', '.0f')} tokens/s; "
        f"(secondary) mean TTFT {per_k(sy, 'ttft_mean_s', '.2f')} s",
        ordering=ramp["k4"] < ramp["k2"] < ramp["k1"] and tput["k1"] < min(tput["k2"], tput["k4"]),
        cause="k moves the start of the ramp, not where it reaches "
        f"{RAMP_SHARE:.0%}: the first execution pipeline forms at "
        f"{per_k(sy, 'first_pipeline_s', '.2f')} s and the rate reaches 20% of the best peak "
        f"at {share['20%']} s, 50% at {share['50%']} s (k=1 / 2 / 4), but {RAMP_SHARE:.0%} at "
        f"{per_k(sy, 'ramp_s', '.2f')} s, when most of the 12 nodes serve (k sources shorten "
        "the time to the first complete instance, §4.2's b/k steps, not to the last). The "
        f"burst's last token ({per_k(sy, 'last_token_s', '.2f')} s) follows its last first "
        f"token ({last_first}: 100 requests on 12 x {MAX_BATCH} slots), so the overall "
        "throughput over the burst is the same." + stress_text,
    )


def report_rows(doc: dict) -> list[dict]:
    """REPORT.md rows (`report.py`)."""
    return [fig16_row(doc["fig16"])]


def draw(doc: dict) -> object:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for i, (title, part) in enumerate(
        (
            ("100 requests at once", doc["fig16"]),
            ("stress (counterfactual)", doc["fig16"]["stress_counterfactual"]),
        )
    ):
        for name, v in part["systems"].items():
            c = smooth(np.array(v["rate_curve"]), SMOOTH_BINS)
            ax[i].plot(np.arange(len(c)) * STEP_S, c, label=name)
        ax[i].set(title=f"Fig. 16 {title}: token rate (0.5-s mean)", xlabel="s", ylabel="tokens/s")
        ax[i].legend()
    return fig


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.info("running fig16")
    doc = {"fig16": fig16()}
    write("lambdascale_kway", doc, draw(doc))


if __name__ == "__main__":
    sys.exit(run_main(main))
