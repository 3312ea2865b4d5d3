"""What `lambdascale_blocks.py`'s runs say: λScale Fig. 8 / 18 / 17's numbers, emulated beside
simulated, REPORT.md's emulated cells (`report_emulated`, read by benchmarks/paper/emulated.py)
and the figure. In: the result JSON's `fig8`, `fig18`, `fig17` runs (keys
`system/nodes/blocks`, each with `emulated` and `simulated`). Every time is emulated seconds.
"""

import json
import statistics
from pathlib import Path

ABLATION = Path(__file__).resolve().parents[1] / "results/paper/lambdascale_ablation.json"
"""`paper/lambdascale/lambdascale_ablation.py`'s Fig. 17 steps on a local socket (real s)."""
PAPER = {
    "fig8": "λScale §7.2 Fig. 8 (Llama-2 13B, k = 1, 4/8/12 nodes): λScale 'receives the first "
    "and last model blocks almost at the same time across all cluster sizes'; NCCL 'experiences "
    "a significantly high tail latency for the first block, due to high group initialization "
    "overhead'; 'FaaSNet's tail latency grows as the cluster size increases'",
    "fig18": "λScale §7.6 Fig. 18: '16 blocks achieve the lowest transfer latency'",
    "fig17": "λScale §7.6 Fig. 17: 'None' above 20 ms; +Pre-alloc, +Tensor-pack, +Host-mem RDMA "
    "each lower",
}


def _runs(report: dict, part: str) -> list[dict]:
    return list(report.get(part, {}).values())


def _violations(runs: list[dict]) -> tuple[int, int]:
    e = [r["emulated"]["emulation"] for r in runs]
    return sum(x["violations"] for x in e), sum(x["steps"] for x in e)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def fig8_summary(runs: list[dict]) -> dict:
    """Per node count and system: first / last block at A and B, the spread at B and every
    node's last block; the tail growth from the fewest to the most nodes; the paper's three
    claims as booleans, per body."""
    by: dict = {}
    for r in runs:
        for body in ("emulated", "simulated"):
            x = r[body]
            by.setdefault(body, {}).setdefault(str(r["nodes"]), {})[r["system"]] = {
                "first_s": x["first_s"],
                "last_s": x["last_s"],
                "spread_B_s": x["spread_B_s"],
                "complete_s": x["complete_s"],
            }
    out: dict = {"by_nodes": by, "claims": {}}
    for body, table in by.items():
        sizes = sorted(table, key=int)
        lo, hi = table[sizes[0]], table[sizes[-1]]
        growth = {
            s: _ratio(hi[s]["last_s"], lo[s]["last_s"]) for s in hi if s in lo and len(sizes) > 1
        }
        claims = {"tail_growth": growth, "nodes": [int(sizes[0]), int(sizes[-1])]}
        if {"lambdascale", "nccl"} <= set(hi):
            claims["nccl_first_late"] = hi["nccl"]["first_s"] > hi["lambdascale"]["first_s"]
        if {"lambdascale", "faasnet", "nccl"} <= set(hi):
            claims["lambdascale_last_first"] = hi["lambdascale"]["last_s"] < min(
                hi["nccl"]["last_s"], hi["faasnet"]["last_s"]
            )
        if growth.get("faasnet") and growth.get("lambdascale"):
            claims["faasnet_tail_grows_faster"] = growth["faasnet"] > growth["lambdascale"]
        out["claims"][body] = claims
    return out


def fig18_summary(runs: list[dict]) -> dict:
    """Per block count the time until every node holds every block; the best count; B = 8's
    and B = 48's time over B = 16's."""
    out: dict = {"complete_s": {}, "best_blocks": {}, "over_b16": {}}
    for body in ("emulated", "simulated"):
        c = {str(r["blocks"]): r[body]["complete_s"] for r in runs}
        out["complete_s"][body] = dict(sorted(c.items(), key=lambda kv: int(kv[0])))
        done = {b: t for b, t in c.items() if t is not None}
        out["best_blocks"][body] = int(min(done, key=done.get)) if done else None
        out["over_b16"][body] = {b: _ratio(c.get(b), c.get("16")) for b in ("8", "48") if b in c}
    return out


def block_gaps(arrival_b: list[float]) -> list[float]:
    """Each block's transfer at a lone receiver: the gap since the block before (the first
    since the start)."""
    return [round(t - s, 4) for s, t in zip([0.0, *arrival_b], arrival_b, strict=False)]


def fig17_summary(runs: list[dict]) -> dict:
    """One receiver: each block's transfer (the gap since the block before), emulated and
    simulated; the emulated median over the simulated one."""
    out: dict = {}
    for r in runs:
        gaps = {b: block_gaps(r[b]["arrival_s"]["B"]) for b in ("emulated", "simulated")}
        med = {b: round(statistics.median(g), 5) for b, g in gaps.items() if g}
        out = {
            "block_s": gaps,
            "median_block_s": med,
            "emulated_over_simulated": _ratio(med.get("emulated"), med.get("simulated")),
            "blocks": r["blocks"],
        }
        d = r["emulated"]["emulation"]["time_dilation"]
        if ABLATION.exists():  # the socket ablation's host costs on the emulated clock
            fastest = json.loads(ABLATION.read_text())["fastest_s"]
            out["socket_ablation_over_d_s"] = {k: round(v / d, 6) for k, v in fastest.items()}
    return out


def summarize(report: dict) -> dict:
    make = {"fig8": fig8_summary, "fig18": fig18_summary, "fig17": fig17_summary}
    out = {p: f(_runs(report, p)) for p, f in make.items() if report.get(p)}
    out["violations"] = {p: list(_violations(_runs(report, p))) for p in make if report.get(p)}
    out["paper"] = PAPER
    return out


def _setting(report: dict, runs: list[dict], nodes: str) -> str:
    """'EMULATED (preset:model, N nodes, dilation D, cluster): ' with the runs' own D."""
    ds = sorted({r["emulated"]["emulation"]["time_dilation"] for r in runs})
    kinds = sorted({r["emulated"]["cluster"] for r in runs})
    loads = [r["emulated"]["emulation"]["load_average_start"][0] for r in runs]
    loads += [r["emulated"]["emulation"]["load_average_end"][0] for r in runs]
    return (
        f"EMULATED ({report['emulate']}, {nodes} nodes, dilation "
        f"{'/'.join(f'{d:g}' for d in ds)}, {'/'.join(kinds)}, host load "
        f"{min(loads):.1f}-{max(loads):.1f}): "
    )


def _tail(runs: list[dict]) -> str:
    bad, steps = _violations(runs)
    over = " (over 1%: not the emulated cluster's)" if steps and bad > 0.01 * steps else ""
    return f"; {bad} of {steps} paced steps violated{over}"


def fig8_cell(report: dict, s: dict) -> str:
    runs = _runs(report, "fig8")
    emu, sim = s["by_nodes"]["emulated"], s["by_nodes"]["simulated"]
    sizes = sorted(emu, key=int)
    hi = sizes[-1]
    last = ", ".join(
        f"{n} {emu[hi][n]['last_s']:.3f} s (sim {sim[hi][n]['last_s']:.3f})" for n in emu[hi]
    )
    parts = [f"last block at A/B, {hi} nodes: {last}"]
    ce, cs = s["claims"]["emulated"], s["claims"]["simulated"]
    growth = ", ".join(
        f"{n} x{g} (sim x{cs['tail_growth'].get(n)})" for n, g in ce["tail_growth"].items()
    )
    if growth:
        parts.append(f"last block {sizes[0]}->{hi} nodes {growth}")
    if "nccl" in emu[hi] and "lambdascale" in emu[hi]:
        parts.append(
            f"first block NCCL {emu[hi]['nccl']['first_s']:.3f} s vs λScale "
            f"{emu[hi]['lambdascale']['first_s']:.3f} s (sim {sim[hi]['nccl']['first_s']:.3f} / "
            f"{sim[hi]['lambdascale']['first_s']:.3f})"
        )
    if "lambdascale" in emu[hi]:
        parts.append(
            f"λScale first-to-last at B {emu[hi]['lambdascale']['spread_B_s']:.3f} s (sim "
            f"{sim[hi]['lambdascale']['spread_B_s']:.3f})"
        )
    return _setting(report, runs, "/".join(sizes)) + "; ".join(parts) + _tail(runs)


def fig18_cell(report: dict, s: dict) -> str:
    runs = _runs(report, "fig18")
    c = s["complete_s"]
    times = ", ".join(
        f"B={b} {t:.3f} s (sim {c['simulated'][b]:.3f})"
        for b, t in c["emulated"].items()
        if t is not None
    )
    nodes = "/".join(sorted({str(r["nodes"]) for r in runs}))
    return (
        _setting(report, runs, nodes)
        + f"λScale multicast end {times}; best B = {s['best_blocks']['emulated']} (sim "
        f"{s['best_blocks']['simulated']}: its block multicast with no per-transfer cost); "
        "the emulated link has no per-transfer GPU cost and the host's is divided by D, so "
        "more blocks only pipeline better (the simulator column's B = 16 is the per-transfer "
        "overhead it charges)" + _tail(runs)
    )


def fig17_cell(report: dict, s: dict) -> str:
    runs = _runs(report, "fig17")
    med = s["median_block_s"]
    return (
        _setting(report, runs, "2")
        + f"one block of {s['blocks']} over the emulated link, the runtime's one configuration "
        f"(packed blocks, tier buffers allocated before the pull, received where they serve: "
        f"Fig. 17's +Host-mem RDMA): median {med['emulated'] * 1e3:.1f} ms (sim "
        f"{med['simulated'] * 1e3:.1f} ms); None / +Pre-alloc / +Tensor-pack cannot be switched "
        "on in the runtime, and their costs are host work, divided by D here"
        + _ablation(s)
        + _tail(runs)
    )


def _ablation(s: dict) -> str:
    """The socket ablation's steps as the emulated clock would see them (/ D)."""
    a = s.get("socket_ablation_over_d_s")
    if not a:
        return ""
    steps = " > ".join(f"{k} {v * 1e3:.2f}" for k, v in a.items())
    return f" (the local-socket ablation's {steps} ms, each / D)"


def report_cells(report: dict) -> list[dict]:
    """REPORT.md's emulated cells for the figures run (`benchmarks/paper/emulated.py`)."""
    s = report["summary"]
    make = {"fig8": ("Fig. 8", fig8_cell), "fig18": ("Fig. 18", fig18_cell)}
    make["fig17"] = ("Fig. 17", fig17_cell)
    return [
        {"paper": "λScale", "figure": fig, "emulated": cell(report, s[part])}
        for part, (fig, cell) in make.items()
        if part in s
    ]


def plot(report: dict, path: Path) -> None:
    """Fig. 8: block-arrival CDF at node B, most nodes, emulated (solid) and simulated
    (dashed); Fig. 18: multicast end per block count; Fig. 17: each block's transfer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4))
    runs8 = _runs(report, "fig8")
    if runs8:
        hi = max(r["nodes"] for r in runs8)
        for r in (r for r in runs8 if r["nodes"] == hi):
            for body, ls in (("emulated", "-"), ("simulated", "--")):
                t = r[body]["arrival_s"]["B"]
                ax[0].step(t, [(i + 1) / len(t) for i in range(len(t))], ls, where="post",
                           label=f"{r['system']} {body}")  # fmt: skip
        ax[0].set(title=f"Fig. 8: block arrivals at node B, {hi} nodes", xlabel="s", ylabel="CDF")
        ax[0].legend(fontsize=7)
    s = report["summary"]
    if "fig18" in s:
        for body, c in s["fig18"]["complete_s"].items():
            ax[1].plot([int(b) for b in c], list(c.values()), "o-", label=body)
        ax[1].set(title="Fig. 18: λScale multicast end", xlabel="blocks", ylabel="s")
        ax[1].legend(fontsize=7)
    if "fig17" in s:
        for body, g in s["fig17"]["block_s"].items():
            ax[2].plot(range(len(g)), [v * 1e3 for v in g], "o-", label=body)
        ax[2].set(title="Fig. 17: each block's transfer, 2 nodes", xlabel="block", ylabel="ms")
        ax[2].legend(fontsize=7)
    fig.suptitle(f"EMULATED {report['emulate']} (λScale Fig. 8 / 18 / 17)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
