"""REPORT.md rows of λScale Fig. 8, 10, 11 and 18 (`lambdascale_figs.py` writes the JSON).

In: benchmarks/results/paper/lambdascale_figs.json as `lambdascale_figs.py` wrote it. Out:
`report_rows(doc)`, the rows `report.py` turns into REPORT.md, each judged by the paper's
own words (quoted below).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/paper: rows

from lambdascale_bursts import sllm_start_cause
from rows import NO_TOP, TOLERANCE, row

PAPER = "λScale"
FIG10_QUOTE = (
    "Fig. 10 shows that λScale scales 2× to over 4× faster than ServerlessLLM in many scenarios"
)
"""λScale §7.3, the only number for Fig. 10 in the text (no ratio per model; FaaScale drops
the figure). Its top is open ("over 4×", no bound above), so Fig. 10 is judged against
[2, NO_TOP]: each model's ratio >= 2 x (1 - TOLERANCE)."""
FIG10_RANGE = (2.0, NO_TOP)
FIG8_QUOTE = (
    "FaaSNet's tree-based multicast algorithm (binary tree) limits parallelism to a fixed "
    "number of children nodes at the bottom of the topology"
)
"""λScale §7.2's reason for FaaSNet's tail growing with the cluster (Fig. 8)."""


def _fmt(d: dict) -> str:
    return " / ".join(f"{v:.2f}x" for v in d.values())


def fig8_row(f8: dict) -> dict:
    last, last12 = f8["last_block_s"], f8["last_block_s"]["12"]
    w = f8["counterfactual_faasnet_whole_model"]
    return row(
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
        "waits for its group set-up, as §7.2 says; FaaSNet's tail does not grow faster "
        "than λScale's. FaaSNet runs as λScale §7.1 deploys it (\"its default binary tree "
        'topology", over GDR) and as its own function tree streams, block by block to '
        "each child, so a level deeper adds about one block time, as a binomial doubling "
        f"does (4 -> 12 nodes: FaaSNet +{last12['faasnet'] - last['4']['faasnet']:.3f} s, "
        f"λScale +{last12['lambdascale'] - last['4']['lambdascale']:.3f} s); §7.2's reason "
        f'("{FIG8_QUOTE}") costs senders, not time, once blocks are pipelined. '
        "Counterfactual: forwarding the whole model (store and forward), the one change "
        f"that makes the tail grow with depth: FaaSNet's tail 4->12 nodes "
        f"x{w['tail_growth_4_to_12']:.2f} ({w['last_block_s']['4']:.2f} -> "
        f"{w['last_block_s']['12']:.2f} s), but all 12 nodes hold 13B "
        f"{w['complete_12_over_lambdascale']:.2f}x later than with λScale, where Fig. 7 "
        "gives up to 1.82x: not the paper's FaaSNet either.",
    )


def _ramps(fig: dict) -> tuple[float, dict, dict, dict, str]:
    """S-LLM's derived start; the ramp ratios per model at the shipped start, at 0 and at
    the derived one; and the simulator column's text (Fig. 10 and 11 alike)."""
    start, models = fig["serverlessllm_start_s"], fig["models"]
    shipped = {m: v["ramp_ratio"] for m, v in models.items()}
    at0 = {m: v["ramp_ratio_init0"] for m, v in models.items()}
    derived = {m: v["ramp_ratio_fig12start"] for m, v in models.items()}
    text = (
        f"ramp S-LLM / λScale 7B / 13B / 70B with S-LLM's start derived from Fig. 12 "
        f"({start:.1f} s): {_fmt(derived)}; shipped 0.5 s: {_fmt(shipped)}; 0: {_fmt(at0)}"
    )
    return start, shipped, at0, derived, text


def fig10_row(f10: dict) -> dict:
    start, r10, r10z, r10d, text = _ramps(f10)
    r10o = {m: v.get("ramp_ratio_init0_one_batch", float("nan")) for m, v in f10["models"].items()}
    floor = FIG10_RANGE[0] * (1 - TOLERANCE)
    short = [f"{m.removeprefix('llama2-').upper()} {v:.2f}x" for m, v in r10.items() if v < floor]
    return row(
        PAPER,
        "Fig. 10",
        "scaling via the local cache: λScale reaches peak throughput 2x to over 4x "
        "sooner than ServerlessLLM (7B/13B k=8 of 12, 70B k=2 of 4)",
        "2x to over 4x (no top)",
        text,
        ordering=min(r10d.values()) > 1,
        sim_range=(min(r10d.values()), max(r10d.values())),
        paper_range=FIG10_RANGE,
        cause=f'Judged against §7.3\'s "{FIG10_QUOTE}": no ratio per model and no bound '
        f"above, so each model must reach {floor:.1f}x (2x less 20%). "
        + sllm_start_cause(start, _fmt(r10), _fmt(r10z), _fmt(r10o), min(r10z.values()) > 1)
        + (f" At 0.5 s {', '.join(short)} falls below {floor:.1f}x." if short else "")
        + f" 7B's {r10d['llama2-7b']:.1f}x: its load from host memory takes about 0.2 s, "
        "so the start is most of ServerlessLLM's ramp there.",
    )


def report_rows(doc: dict) -> list[dict]:
    """The REPORT.md rows these figures give (`report.py`)."""
    f18 = doc["fig18"]
    _, _, r11z, r11d, text11 = _ramps(doc["fig11"])
    return [
        fig8_row(doc["fig8"]),
        fig10_row(doc["fig10"]),
        row(
            PAPER,
            "Fig. 11",
            "cold start (one host copy, k=1): λScale 3.75x to 11.4x faster than "
            "ServerlessLLM (SSD on the other nodes)",
            "3.75-11.4x",
            text11,
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
