"""The "emulated runtime" column of REPORT.md: what the GPU-time emulation measured.

In: benchmarks/results/emulation/*.json written by the emulation benchmarks (benchmarks/emulation/,
real agents paced as the paper's cluster, docs/emulation.md). Out: "paper|figure" -> one
table cell, labelled EMULATED with its setting. Two ways in: the known result files below,
and any result JSON carrying a top-level `report_emulated` list of {"paper", "figure",
"emulated"} (how a new emulation benchmark adds its cell without touching this file).
Owned by the paper reproductions.
"""

import json
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("report.emulated")


def _lambdascale_fig9(doc: dict) -> dict[str, str]:
    s = doc["summary"]
    cap, ratio = s["first_capacity_s"]["emulated"], s["k1_over_k4_first_capacity"]
    return {
        "λScale|Fig. 9": f"EMULATED ({doc['emulate']}, {doc['nodes']} agents, dilation "
        f"{doc['time_dilation']:g}): first capacity k=1 {cap['1']:.2f} s, k=4 {cap['4']:.3f} s "
        f"({ratio['emulated']:.2f}x; sim {ratio['simulated']:.2f}x)"
    }


def _paraserve_fig8(doc: dict) -> dict[str, str]:
    ft, g = doc["first_token_s"]["emulated"], str(doc["nodes"])
    vllm = ""
    if "serverless-vllm" in ft:
        vs = doc["speedup_vs_serverless_vllm"]
        vllm = (
            f", serverless vLLM {ft['serverless-vllm']:.2f} s ({vs['emulated']:.2f}x; sim "
            f"{vs['simulated']:.2f}x)"
        )
    bad = doc.get("violations") or {}
    tail = ""
    if bad:
        v, n = (sum(x[i] for x in bad.values()) for i in (0, 1))
        load = doc["machine"].get("load_average_start", [None])[0]
        tail = f"; {v} of {n} steps violated, host load {load:.1f} at the start"
    return {
        "ParaServe|Fig. 8": f"EMULATED ({doc['emulate']}, dilation {doc['time_dilation']:g}): "
        f"cold-start TTFT 1 worker {ft['1']:.2f} s, {g} workers {ft[g]:.2f} s "
        f"({doc['group_speedup']['emulated']:.2f}x; sim {doc['group_speedup']['simulated']:.2f}x)"
        f"{vllm}{tail}"
    }


def _head(doc: dict) -> str:
    return f"EMULATED ({doc.get('emulate')}, dilation {doc.get('time_dilation', 0):g})"


def _blitzscale_6_1(doc: dict) -> dict[str, str]:
    """benchmarks/emulation/blitzscale.py: BlitzScale / S-LLM and / AllCache mean TTFT."""
    emu = doc["ratios_to_blitzscale"]["emulated"]
    sim = doc["ratios_to_blitzscale"]["simulated"]

    def cell(other: str) -> str:
        e = (emu.get(other) or {}).get("ttft_mean_s")
        s = (sim.get(other) or {}).get("ttft_mean_s")
        return f"{other} {e}x (sim {s}x)" if e is not None else f"{other} not run (sim {s}x)"

    start = (doc.get("simulated_engine_start_s") or {}).get("allcache")
    note = (
        f"; sim beside it with S-LLM/AllCache's engine start {start:g} s as the runtime's"
        if start is not None
        else ""
    )
    return {
        "BlitzScale|§6.1 Fig. 13 7b-azurecode": f"{_head(doc)}, {doc.get('requests')} "
        "requests: mean TTFT BlitzScale / "
        + ", ".join(cell(o) for o in ("serverlessllm", "allcache"))
        + note
    }


def _flexpipe_fig8(doc: dict) -> dict[str, str]:
    """benchmarks/emulation/flexpipe.py: per CV, the best static shape's and ServerlessLLM's
    mean latency over FlexPipe's (emulated, the simulator's beside) and FlexPipe's refactors."""
    emu, sim = doc["ratios_to_flexpipe"]["emulated"], doc["ratios_to_flexpipe"]["simulated"]

    def best_static(row: dict) -> float | None:
        xs = [
            v["e2e_mean_s"]
            for k, v in row.items()
            if k.startswith("static-") and v.get("e2e_mean_s")
        ]
        return min(xs, default=None)

    def x(v: float | None) -> str:
        return f"{v}x" if v is not None else "not run"

    parts = []
    for cv, row in sorted(emu.items(), key=lambda kv: float(kv[0])):
        srow = sim.get(cv, {})
        sllm = (row.get("serverlessllm") or {}).get("e2e_mean_s")
        sim_sllm = (srow.get("serverlessllm") or {}).get("e2e_mean_s")
        fp = (doc["emulated"][cv].get("flexpipe") or {}).get("flexpipe") or {}
        cuts = fp.get("refactors") or {}
        parts.append(
            f"CV {cv}: best static / FlexPipe {x(best_static(row))} "
            f"(sim {x(best_static(srow))}), S-LLM / FlexPipe {x(sllm)} (sim {x(sim_sllm)}), "
            f"splits/merges {cuts.get('split', 0)}/{cuts.get('merge', 0)}"
        )
    return {"FlexPipe|Fig. 8": f"{_head(doc)}: mean latency " + "; ".join(parts)}


KNOWN: dict[str, Callable[[dict], dict[str, str]]] = {
    "emulation_lambdascale_d80.json": _lambdascale_fig9,
    "emulation_paraserve.json": _paraserve_fig8,
    "emulation_blitzscale.json": _blitzscale_6_1,
    "emulation_flexpipe.json": _flexpipe_fig8,
}
"""Result files of the emulation benchmarks that predate `report_emulated`."""


def emulated_cells(results_dir: Path) -> dict[str, str]:
    """Every emulated cell found under `results_dir` (top level only)."""
    cells: dict[str, str] = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            log.warning("%s unreadable: skipped", path)
            continue
        if not isinstance(doc, dict):
            continue
        if path.name in KNOWN:
            try:
                cells |= KNOWN[path.name](doc)
            except (KeyError, TypeError, AttributeError) as exc:  # a layout we do not know
                log.warning("%s: no emulated cell (%r)", path, exc)
        for item in doc.get("report_emulated", ()):
            cells[f"{item['paper']}|{item['figure']}"] = str(item["emulated"])
    return cells
