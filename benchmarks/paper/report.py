"""Generates benchmarks/paper/REPORT.md from the reproductions' JSON (never edit it by hand).

In: each reproduction script's result JSON, read back through its `report_rows(doc)` (the
claim, the paper's number, the simulated one and, for a miss, its cause with the measured
counterfactual the script ran: `rows.row`); the emulated runtime's results
(benchmarks/results/emulation/*.json, `emulated.py`). Out: REPORT.md, one
table per paper: figure, claim, paper, simulator, emulated runtime, ordering holds, within
20%, cause where not. Owned by the paper reproductions.
Run: python benchmarks/paper/report.py  (seconds; it runs no simulation)
"""

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from emulated import emulated_cells

HERE = Path(__file__).resolve().parent
PAPER_FOLDERS = ("lambdascale", "blitzscale", "flexpipe", "paraserve")
"""One folder per paper beside the shared pieces; each source module lives in one."""
sys.path[1:1] = [str(HERE / folder) for folder in PAPER_FOLDERS]  # their `report_rows`
ROOT = HERE.parents[1]
log = logging.getLogger("report")
RESULTS = ROOT / "benchmarks" / "results" / "emulation"
PAPERS = ("λScale", "BlitzScale", "FlexPipe", "ParaServe")
SOURCES = (
    ("reproduce", "benchmarks/paper/results.json", "python benchmarks/paper/reproduce.py"),
    ("lambdascale_traces", "benchmarks/results/paper/lambdascale_traces.json", None),
    ("lambdascale_bursts", "benchmarks/results/paper/lambdascale_bursts.json", None),
    ("lambdascale_kway", "benchmarks/results/paper/lambdascale_kway.json", None),
    (
        "lambdascale_figs_rows",
        "benchmarks/results/paper/lambdascale_figs.json",
        "python benchmarks/paper/lambdascale/lambdascale_figs.py",
    ),
    ("lambdascale_ablation", "benchmarks/results/paper/lambdascale_ablation.json", None),
    (
        "blitzscale_eval_rows",
        "benchmarks/results/paper/blitzscale_eval.json",
        "python benchmarks/paper/blitzscale/blitzscale_eval.py",
    ),
    (
        "blitzscale_figs_rows",
        "benchmarks/results/paper/blitzscale_figs.json",
        "python benchmarks/paper/blitzscale/blitzscale_figs.py",
    ),
    (
        "flexpipe_shared_rows",
        "benchmarks/results/paper/flexpipe_shared.json",
        "python benchmarks/paper/flexpipe/flexpipe_shared.py",
    ),
    (
        "flexpipe_figs_rows",
        "benchmarks/results/paper/flexpipe_figs.json",
        "python benchmarks/paper/flexpipe/flexpipe_figs.py",
    ),
    (
        "paraserve_rows",
        "benchmarks/results/paper/paraserve_eval.json",
        "python benchmarks/paper/paraserve/paraserve_eval.py",
    ),
)
"""(module in benchmarks/paper/<paper>/ whose `report_rows(doc)` reads the JSON, the result
JSON, how to make it when that is not running the module's own script, `script_of`)."""
COLUMNS = (
    "figure",
    "claim",
    "paper",
    "simulator",
    "emulated runtime",
    "ordering holds",
    "within 20%",
    "cause where not",
)


def script_of(module: str) -> str:
    """The script of a module: in its paper's folder, else beside this file."""
    found = [HERE / folder / f"{module}.py" for folder in PAPER_FOLDERS]
    path = next((p for p in found if p.exists()), HERE / f"{module}.py")
    return str(path.relative_to(ROOT))


class ReportError(Exception):
    """A result file the report needs is missing or unreadable."""


def collect(
    sources: Iterable[tuple[str, str, str | None]] = SOURCES,
    load_rows: Callable[[str], Callable[[dict], list[dict]]] | None = None,
) -> list[dict]:
    """Every row of every source, in source order."""
    load_rows = load_rows or (lambda module: importlib.import_module(module).report_rows)
    rows: list[dict] = []
    for module, path, how in sources:
        file = ROOT / path
        if not file.exists():
            make = how or f"python {script_of(module)}"
            raise ReportError(f"{path} is missing: run `{make}` first")
        try:
            doc = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ReportError(f"{path} is unreadable ({exc}); run its script again") from exc
        for r in load_rows(module)(doc):
            rows.append({**r, "source": path})
    return rows


def merge(rows: list[dict], emulated: dict) -> list[dict]:
    """Rows with the emulated runtime's cell ("paper|figure" -> text) added."""
    return [{**r, "emulated": emulated.get(f"{r['paper']}|{r['figure']}")} for r in rows]


def _flag(v: bool | None) -> str:
    return "n/a" if v is None else ("yes" if v else "**no**")


def _cell(text: object) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def missed(r: dict) -> bool:
    """The row misses the paper: its ordering fails or its number is over 20% off."""
    return r["ordering"] is False or r["within_20"] is False


def render(rows: list[dict]) -> str:
    """REPORT.md's text."""
    ok = [r for r in rows if r["ordering"] is not False and r["within_20"] is not False]
    unexplained = [r for r in rows if missed(r) and not r.get("cause")]
    lines = [
        "# Paper reproductions: every headline figure",
        "",
        "GENERATED by `python benchmarks/paper/report.py` from the reproductions' JSON; do "
        "not edit by hand (the history of each number: `benchmarks/paper/NOTES.md`). Rerun "
        "the scripts named in `benchmarks/paper/reproduce.py --all`, then this.",
        "",
        "Columns: the paper's number; the simulator's at the paper's scale (deterministic, "
        "virtual time); the emulated runtime's (real agents on GPU time, labelled where "
        "run); ordering holds (the paper's who-beats-whom); within 20% (|sim / paper - 1| "
        "<= 0.2, or every point inside the paper's range widened by 20%; a claim worded "
        '"X% lower / shorter / less" is judged on its ratio ours / baseline = 1 - X against '
        "the paper's 1 - X; n/a: the paper gives no number); where either fails, the "
        "measured cause (a counterfactual: one assumption changed, the ratio moves).",
        "",
        f"**{len(ok)} of {len(rows)} rows ({len(ok) / max(len(rows), 1):.0%}) hold the "
        f"ordering and are within 20% (or give no number); {len(rows) - len(ok)} miss, "
        f"{len(unexplained)} of them without a measured cause.**",
        "",
    ]
    for paper in PAPERS + tuple(sorted({r["paper"] for r in rows} - set(PAPERS))):
        mine = [r for r in rows if r["paper"] == paper]
        if not mine:
            continue
        lines += [f"## {paper}", "", "| " + " | ".join(COLUMNS) + " |"]
        lines.append("|" + "---|" * len(COLUMNS))
        for r in mine:
            cause = r.get("cause") or ("**not measured**" if missed(r) else "")
            cells = (
                r["figure"],
                r["claim"],
                r["paper_value"],
                r["simulator"],
                r.get("emulated") or "not run",
                _flag(r["ordering"]),
                _flag(r["within_20"]),
                cause if missed(r) else (cause or ""),
            )
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "REPORT.md", help="where to write")
    args = parser.parse_args(argv)
    try:
        rows = collect()
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = merge(rows, emulated_cells(RESULTS))
    args.out.write_text(render(rows) + "\n")
    log.info("wrote %s (%d rows)", args.out, len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
