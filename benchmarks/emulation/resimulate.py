"""The simulator's column of an emulation result, rerun on this code; the emulated runs stay.

In: a result JSON of `benchmarks.emulation.lambdascale` (by K and mode),
`benchmarks.emulation.paraserve` (by run) or `benchmarks.emulation.flexpipe` (by CV and
variant), its scenario read from the file. Out: the same
file with every simulated number, the ratios and the simulator's errors recomputed by this
checkout's simulator, and `simulated_code` (the commit they came from; each emulated run
keeps its own `code`). The simulator is deterministic and needs no quiet machine, so a
simulator change (e.g. 093068c: work reaches an engine only at its step boundaries) reaches
every current result without rerunning the emulated side. A paraserve result whose emulated
and simulated columns should be one code version is rerun whole instead.

Usage: python -m benchmarks.emulation.resimulate RESULT.json [--png RESULT.png]
"""

import argparse
import json
import logging
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import code_version
from benchmarks.emulation import flexpipe, lambdascale, paraserve
from surge.emulation import EmulationConfig

log = logging.getLogger("emulation_resimulate")


def lambdascale_result(report: dict) -> dict:
    """Every K and mode's simulated burst, the isolated multicast and the summary."""
    config = EmulationConfig.parse(report["emulate"], report["time_dilation"])
    args = SimpleNamespace(**{k: report[k] for k in lambdascale.SCENARIO_KEYS})
    for k, run in report["by_sources"].items():
        run["simulated"] = {
            mode: lambdascale.run_simulated(args, config, int(k), mode, report["blocks"])
            for mode in run["emulated"]
        }
    ks = [int(k) for k in report["by_sources"]]
    report["isolated_multicast_sim"] = lambdascale.isolated(config, report["nodes"], ks)
    runs = report["by_sources"].values()
    modes = [m for m in lambdascale.MODES if all(m in r["emulated"] for r in runs)]
    report["summary"] = lambdascale.summary(report, ks, modes)
    return report


def paraserve_result(report: dict) -> dict:
    """Every run's simulated first token, the group's speedups and the errors."""
    config = EmulationConfig.parse(report["emulate"], report["time_dilation"])
    runs = paraserve.variants(report["nodes"])
    first = report["first_token_s"]
    first["simulated"] = {
        name: paraserve.simulated(config, runs[name][0], runs[name][1], report["prompt_len"])
        for name in first["emulated"]
    }
    return report | paraserve.derived(first, report["nodes"])


def flexpipe_result(report: dict) -> dict:
    """Every (CV, variant) the file ran emulated, simulated; sim / emulated and the ratios."""
    config = EmulationConfig.parse(report["emulate"], report["time_dilation"])
    args = flexpipe.scenario(report["settings"])
    variants = list(dict.fromkeys(v for row in report["emulated"].values() for v in row))
    cvs = sorted(float(cv) for cv in report["emulated"])
    report["simulated"] = flexpipe.simulated(args, config, variants, cvs)
    return report | flexpipe.derived(report)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "json", type=Path, help="an emulation result (lambdascale, paraserve or flexpipe)"
    )
    ap.add_argument("--png", type=Path, default=None, help="redraw its figure here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        report = json.loads(args.json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        ap.error(f"{args.json}: not a readable JSON result ({exc})")
    if "by_sources" in report:
        report, plot = lambdascale_result(report), lambdascale.plot
    elif "first_token_s" in report:
        report, plot = paraserve_result(report), paraserve.plot
    elif "ratios_to_flexpipe" in report:
        report, plot = flexpipe_result(report), flexpipe.plot
    else:
        ap.error(f"{args.json}: not a lambdascale, paraserve or flexpipe emulation result")
    report["simulated_code"] = code_version()
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.png is not None:
        plot(report, args.png)
    keys = ("summary", "group_speedup", "sim_error", "sim_over_emulated")
    print(json.dumps({k: report[k] for k in keys if k in report}, indent=1))


if __name__ == "__main__":
    main()
