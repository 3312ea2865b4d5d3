"""The REPORT.md cell and the figure of `flexpipe_fig11.py`'s result (FlexPipe Fig. 11 on
the emulated runtime, beside the simulator).

In: the result dict (`emulated` per system with its `stall_recovery` and violations,
`simulated` per system, the setting). Out: `cells` (the top-level `report_emulated` list
that `benchmarks/paper/emulated.py` reads into the "emulated runtime" column) and `plot`
(each request's latency over its arrival, both bodies, with §9.3's 1.5x / 1.2x P25 lines).
Every number is labelled EMULATED with preset, GPUs, D and the violations. Owned by
benchmarks/emulation/.
"""

from pathlib import Path
from typing import Any

NAMES = {"flexpipe": "FlexPipe", "alpaserve": "AlpaServe", "serverlessllm": "ServerlessLLM"}


def _recovery(st: dict[str, Any]) -> str:
    if not st["stalls"]:
        return "no stall"
    return f"{st['recovery_median_s'] * 1e3:.0f} ms ({st['stalls']})"


def cells(report: dict[str, Any]) -> list[dict[str, str]]:
    """The "emulated runtime" cell of FlexPipe Fig. 11: median recovery (stalls) per system,
    emulated then simulated at the same setting, with the violations and the load."""
    emu, sim = report["emulated"], report["simulated"]
    steps = sum(r["emulation"]["steps"] for r in emu.values())
    bad = sum(r["emulation"]["violations"] for r in emu.values())
    worst = max((r["emulation"]["violation_rate"] or 0.0 for r in emu.values()), default=0.0)
    start = report["machine"].get("load_average_start")
    ends = [r["load_average"][0] for r in emu.values()]
    load = f"load {start[0]:.1f} at the start, " if start else "load "
    load += f"{min(ends, default=0):.1f}-{max(ends, default=0):.1f} at the runs' ends"
    n = next(iter(emu.values()))["requests"] if emu else 0
    duration_s = float(report["settings"]["duration"])
    head = (
        f"EMULATED ({report['emulate']}, {report['nodes']} GPUs, D={report['time_dilation']:g}; "
        f"{bad} of {steps} steps violated, worst run {worst:.1%}; {load}): "
        f"CV {report['cv']:g}, {report['rate_qps']:g} QPS x {duration_s:g} s ({n} requests; "
        "§9's 82 GPUs / 2 h scaled to a 2-core box)"
    )
    emulated = ", ".join(f"{NAMES[s]} {_recovery(r['stall_recovery'])}" for s, r in emu.items())
    simulated = ", ".join(f"{NAMES[s]} {_recovery(r)}" for s, r in sim.items())
    flag = "" if worst <= 0.01 else " [a run over 1% violations: not the cluster's]"
    text = f"{head}: median recovery (stalls) {emulated}; sim same setting: {simulated}{flag}"
    return [{"paper": "FlexPipe", "figure": "Fig. 11", "emulated": text}]


def plot(report: dict[str, Any], path: Path) -> None:
    """Per system: each request's end-to-end latency over its arrival, emulated and
    simulated, with the P25 baseline's 1.5x (a stall starts) and 1.2x (it ends) lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(report["simulated"])
    fig, axes = plt.subplots(len(systems), 1, figsize=(10, 3 * len(systems)), sharex=True)
    for ax, s in zip(axes, systems, strict=True):
        sides = [("simulated", report["simulated"][s], "tab:orange")]
        if s in report["emulated"]:
            sides.insert(0, ("EMULATED", report["emulated"][s]["stall_recovery"], "tab:blue"))
        for name, st, color in sides:
            xs = [a for a, _ in st["requests"]]
            ys = [x for _, x in st["requests"]]
            ax.plot(xs, ys, ".-", ms=3, lw=0.5, color=color, label=f"{name}: {_recovery(st)}")
            for k, style in ((1.5, "--"), (1.2, ":")):
                ax.axhline(k * st["p25_latency_s"], color=color, ls=style, lw=0.8)
        ax.set_ylabel("latency (emulated s)")
        ax.set_title(
            f"{NAMES[s]}: stalls above the dashed line (1.5x P25), end below dotted (1.2x)"
        )
        ax.legend(fontsize=7)
    axes[-1].set_xlabel("arrival (emulated s)")
    fig.suptitle(
        f"FlexPipe Fig. 11, EMULATED {report['emulate']}, {report['nodes']} GPUs, "
        f"D={report['time_dilation']:g}, CV {report['cv']:g}, {report['rate_qps']:g} QPS"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
