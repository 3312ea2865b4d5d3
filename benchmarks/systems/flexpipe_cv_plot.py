"""The figure of `benchmarks.systems.flexpipe_cv`: p50, p99 and GPU-seconds against arrival
CV, one panel per body (runtime, simulator, simulator with a shorter stage hop, phased
workload) and metric, every variant a line (the peak-provisioned statics dashed, the statics
at flexpipe's cost dotted). In: the report dict the benchmark writes; out: a PNG.
"""

from pathlib import Path

from benchmarks.systems.flexpipe_sim import (
    ISOCOST_VARIANTS,
    PROVISIONED_VARIANTS,
    SIM_VARIANTS,
    VARIANTS,
)


def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if "runtime" in report:
        panels += [
            ("runtime", "e2e_p99_s", "p99 end-to-end (s)"),
            ("runtime", "gpu_seconds", "slot-seconds"),
        ]
    if "sim" in report:
        panels += [
            ("sim", "e2e_p50_s", "p50 end-to-end (s)"),
            ("sim", "e2e_p99_s", "p99 end-to-end (s)"),
            ("sim", "gpu_seconds", "GPU-seconds"),
        ]
        if "hop_sensitivity" in report["sim"]:
            panels.append(("sim-hop", "e2e_p99_s", "p99 end-to-end (s)"))
        if "phased" in report["sim"]:
            panels += [
                ("sim-phased", "e2e_p50_s", "p50 end-to-end (s)"),
                ("sim-phased", "e2e_p99_s", "p99 end-to-end (s)"),
                ("sim-phased", "gpu_seconds", "GPU-seconds"),
            ]
    if "sim" in report:
        panels.append(("sim-advantage", "", "flexpipe vs every static shape"))
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(panels) :]:
        ax.axis("off")
    for ax, (body, key, label) in zip(axes, panels, strict=False):
        if body == "sim-advantage":
            _advantage(ax, report["sim"])
            continue
        if body == "runtime":
            data = report[body]["by_variant"]
        elif body == "sim-hop":
            data = report["sim"]["hop_sensitivity"]["by_cv"]
        elif body == "sim-phased":
            data = report["sim"]["phased"]["by_cv"]
        else:
            data = report[body]["by_cv"]
        sim_variants = [
            v
            for v in (*SIM_VARIANTS, *PROVISIONED_VARIANTS, *ISOCOST_VARIANTS)
            if v in next(iter(data.values()))
        ]
        for v in VARIANTS if body == "runtime" else sim_variants:
            if body == "runtime":
                cvs = list(data[v])
                ys = [data[v][c][key] for c in cvs]
            else:
                cvs = list(data)
                ys = [data[c][v][key] for c in cvs]
            style = {"provisioned": "--", "isocost": ":"}.get(v.split("-")[0], "-")
            ax.plot([float(c) for c in cvs], ys, style, marker="o", markersize=3, label=v)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(
            "arrival CV (phased: of the bursty phases)" if body == "sim-phased" else "arrival CV"
        )
        ax.set_ylabel(label)
        if body == "sim-hop":
            hop_ms = report["sim"]["hop_sensitivity"]["stage_hop_s"] * 1e3
            ax.set_title(f"sim, {hop_ms:g}-ms stage hop: {label}", fontsize=9)
        elif body == "sim-phased":
            phase_s = report["sim"]["phased"]["phase_s"]
            ax.set_title(f"sim, {phase_s:g}-s phases CV 1 / CV: {label}", fontsize=9)
        else:
            ax.set_title(f"{body}: {label}")
    for body in ("runtime", "sim"):  # one legend per variant set
        first = next((i for i, p in enumerate(panels) if p[0].startswith(body)), None)
        if first is not None:
            axes[first].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _advantage(ax, sim: dict) -> None:
    """`flexpipe_ratios.dominance` per CV: the least, over static shapes, of the better of
    its p50 and p99 ratio (solid) and the least of all (dotted); > 1: flexpipe better."""
    runs = [("gamma", sim["by_cv"]), ("phased", sim.get("phased", {}).get("by_cv"))]
    runs.append(("0.1-ms hop", sim.get("hop_sensitivity", {}).get("by_cv")))
    for name, by_cv in runs:
        if not by_cv:
            continue
        cvs = [float(c) for c in by_cv]
        adv = [by_cv[c]["ratios"]["advantage_over_every_static"] for c in by_cv]
        worst = [by_cv[c]["ratios"]["worst_over_statics"] for c in by_cv]
        (line,) = ax.plot(cvs, adv, "-", marker="o", markersize=3, label=f"{name}: advantage")
        ax.plot(cvs, worst, ":", marker="o", markersize=3, color=line.get_color(),
                label=f"{name}: worst")  # fmt: skip
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("arrival CV")
    ax.set_ylabel("static / flexpipe (> 1: flexpipe better)")
    ax.set_title("sim: flexpipe vs every static (p50, p99)", fontsize=9)
    ax.legend(fontsize=7)
