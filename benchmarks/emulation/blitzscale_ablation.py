"""BlitzScale Fig. 17 (§6.3's ablation) on the emulated runtime, beside the simulator.
Labelled EMULATED.

§6.3: "using network multicast for scaling (+Network) can significantly improve the
autoscaling performance ... an interference scale plan reduces the TTFT and TBT across
various workloads by 0.4-5% ... live autoscaling further reduces the latencies by up to 40%
on AzureCode TBT". Four steps, each adding one technique to the one before, run by real
agents through the real controller on §6.1's 7B AzureCode emulation (`blitzscale.py`'s
setting: `blitzscale-a-hosts:llama2-7b`, its first `--nodes` one-GPU hosts, AzureCode x2
from 424 s for 4 s, P/D with BlitzScale's §5.3 monitor, two instances serving at the start):
- `serverlessllm`: loads from its host cache on a hit, else its SSD (§6.1's S-LLM);
- `+network`: BlitzScale's multicast planner (Alg. 1's chains from deployed instances and
  the O(1) host copy, sources by bandwidth left) without line 2's prune of sources whose
  egress serves (a P/D prefill's K/V); load-then-serve, no mutation;
- `+plan`: with the prune;
- `+live`: live scaling and prefill->decode mutation (§4, §5.2): BlitzScale.
The steps are the simulator's own (`blitzscale_figs.ablation_systems`, which Fig. 17's
simulator row runs): the runtime runs the same `SystemConfig`s, registered for this run
under strategy names of their own (`STRATEGIES`; the shipped systems are not changed).
Only the 7B AzureCode workload, at 64 requests (the 8B and 70B workloads of the paper's
figure are the simulator's only). The simulator beside runs the same hosts, requests and
steps. Every time is in emulated seconds.

Usage: python -m benchmarks.emulation.blitzscale_ablation --time-dilation 40 \\
           --png benchmarks/results/emulation/emulation_blitzscale_fig17.png
"""

import itertools
import json
import logging
import sys
from pathlib import Path

import numpy as np

from benchmarks.emulation import blitzscale
from benchmarks.emulation.report import report_head, write_report
from benchmarks.emulation.serving import registered
from benchmarks.emulation.staging import run_on_real_model

log = logging.getLogger("emulation_blitzscale_ablation")
STEPS = ("serverlessllm", "+network", "+plan", "+live")
"""Fig. 17's steps in order, each the one before plus one technique (§6.3)."""
STRATEGIES = {
    "serverlessllm": "serverlessllm",
    "+network": "blitzscale-network",
    "+plan": "blitzscale-plan",
    "+live": "blitzscale",
}
"""The strategy each step is served as (`+network` and `+plan` registered for the run)."""
PAPER = {
    "source": "BlitzScale §6.3 Fig. 17: +Network the large step; +Plan 0.4-5%; +Live up to "
    "40% (AzureCode TBT); average TTFT and TBT",
    "plan_gain": [0.004, 0.05],
    "live_tbt_gain_up_to": 0.40,
}
METRICS = ("ttft_mean_s", "tbt_mean_s")


def ablation_steps() -> dict:
    """Fig. 17's steps as the simulator runs them (`blitzscale_figs.ablation_systems`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper" / "blitzscale"))
    from blitzscale_figs import ablation_systems

    return ablation_systems()


def gains(res: dict) -> dict:
    """Each step's gain over the one before: 1 - its mean / the one before's (per metric);
    None where either step was not run or has no value."""
    out = {}
    for prev, step in itertools.pairwise(STEPS):
        for metric in METRICS:
            a, b = (res.get(prev) or {}).get(metric), (res.get(step) or {}).get(metric)
            out[f"{step}_{metric}"] = round(1 - b / a, 4) if a and b else None
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


MAX_VIOLATION_RATE = 0.01
"""A run with more of its paced steps violated is not the emulated cluster's
(docs/emulation.md "Reading a violation")."""


def report_cell(report: dict) -> str:
    """Fig. 17's "emulated runtime" cell: each step's TTFT and TBT gain, the simulator's
    beside, labelled with the setting and the violations; a gain that rests on a run over
    `MAX_VIOLATION_RATE` is marked "(!)" and that run named."""
    emu, sim, runs = report["gains"]["emulated"], report["gains"]["simulated"], report["emulated"]
    steps = sum(r["emulation"]["steps"] for r in runs.values())
    bad = sum(r["emulation"]["violations"] for r in runs.values())
    loads = [r["load_average"][0] for r in runs.values()]
    over = [s for s in STEPS if runs[s]["emulation"]["violation_rate"] > MAX_VIOLATION_RATE]

    def gain(prev: str, step: str, metric: str) -> str:
        key = f"{step}_{metric}"
        mark = " (!)" if {prev, step} & set(over) else ""
        return f"{_pct(emu[key])}{mark} (sim {_pct(sim[key])})"

    parts = [
        f"{step} TTFT {gain(prev, step, 'ttft_mean_s')}, TBT {gain(prev, step, 'tbt_mean_s')}"
        for prev, step in itertools.pairwise(STEPS)
    ]
    flagged = "; ".join(
        f"{s}'s run {runs[s]['emulation']['violations']} of {runs[s]['emulation']['steps']}"
        for s in over
    )
    tail = f". (!): {flagged} steps violated, not the emulated cluster's" if over else ""
    return (
        f"EMULATED ({report['emulate']}, {report['nodes']} hosts, dilation "
        f"{report['time_dilation']:g}, 7B AzureCode only, {report['requests']} requests; "
        f"{bad} of {steps} steps violated, host load {min(loads):.1f}-{max(loads):.1f}): "
        "gain over the step before, mean " + "; ".join(parts) + tail
    )


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(STEPS))
    for a, metric, scale, unit in (
        (ax[0], "ttft_mean_s", 1, "s"),
        (ax[1], "tbt_mean_s", 1e3, "ms"),
    ):
        for i, (body, res) in enumerate(
            (("emulated", report["emulated"]), ("simulator", report["simulated"]))
        ):
            vals = [(res.get(s) or {}).get(metric) or 0 for s in STEPS]
            a.bar(x + (i - 0.5) * 0.4, [v * scale for v in vals], 0.4, label=body)
        a.set_xticks(x, STEPS)
        a.set(title=f"mean {metric.split('_')[0].upper()}", ylabel=unit)
        a.legend()
    fig.suptitle(
        f"Fig. 17 EMULATED {report['emulate']}, {report['nodes']} hosts, "
        f"D={report['time_dilation']:g}, {report['requests']} AzureCode requests"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = blitzscale.parser(
        __doc__.split("\n")[0],
        STEPS,
        Path("benchmarks/results/emulation/emulation_blitzscale_fig17.json"),
    )
    ap.set_defaults(time_dilation=40.0, max_prompt=1024, drain=1.0)
    args, config, wl = blitzscale.parse_setting(ap, STEPS)
    steps = ablation_steps()
    report: dict = (
        report_head(args, config, PAPER)
        | blitzscale.workload_head(args, wl)
        | {"strategies": STRATEGIES}
    )
    extra = {STRATEGIES[step]: cfg for step, cfg in steps.items() if step in ("+network", "+plan")}
    with registered(extra):
        (report["emulated"], report["staging_real_s"]), report["real_model_bytes"] = (
            run_on_real_model(
                args,
                config,
                lambda tmp, m, e: blitzscale.run_all(args, tmp, m, e, wl, STRATEGIES),
            )
        )
    if getattr(args, "report_only", False):  # every step ran in earlier sittings
        report["machine"]["load_average_start"] = None
        report["machine"]["loads"] = "per run: each step's load_average (its own sitting)"
    report["simulated"] = blitzscale.simulated(args, config, wl, None, steps)
    report["gains"] = {
        "emulated": gains(report["emulated"]),
        "simulated": gains(report["simulated"]),
    }
    report["means"] = {
        body: {s: {m: (report[body].get(s) or {}).get(m) for m in METRICS} for s in STEPS}
        for body in ("emulated", "simulated")
    }
    if all(s in report["emulated"] for s in STEPS):
        report["report_emulated"] = [
            {"paper": "BlitzScale", "figure": "Fig. 17", "emulated": report_cell(report)}
        ]
    write_report(args, report, plot)
    print(json.dumps({k: report[k] for k in ("gains", "means")}, indent=1))


if __name__ == "__main__":
    main()
