"""Shared by the paper reproduction scripts: run a system, summarise, write JSON + PNG.

In: a trace, `SimSettings` and optionally a `SystemConfig` variant. Out: the summary
dict (`surge.sim.metrics.summarize` plus GPU-seconds) and files under
benchmarks/results/paper/ (one JSON and one PNG per script).
"""

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from surge.errors import SurgeError
from surge.policy.systems import SystemConfig
from surge.sim.metrics import summarize
from surge.sim.result import SimResult
from surge.sim.scenario import Scenario
from surge.sim.settings import SimSettings
from surge.sim.simulator import Simulation
from surge.traces.request import Trace

OUT_DIR = Path(__file__).resolve().parents[1] / "results" / "paper"
KEYS = (
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "slo_attainment",
    "gpu_seconds",
    "cache_hits",
    "cache_misses",
    "network_loads",
    "hot_requests",
    "max_host_cache_bytes",
    "finished",
    "requests",
)


def run(
    trace: Trace, settings: SimSettings, system: SystemConfig | None = None
) -> tuple[dict, SimResult]:
    """One simulation; its summary (the KEYS) and the raw result."""
    res = Simulation(trace, settings, system).run()
    full = summarize(res, settings)
    return {k: full[k] for k in KEYS}, res


def run_scenario(scenario: Scenario, trace: Trace, name: str) -> tuple[dict, SimResult]:
    """`name` on a scenario's merged trace with the scenario's overrides."""
    return run(trace, scenario.settings(name), scenario.system(name))


def machine() -> str:
    """Where the numbers came from (the simulator is deterministic; wall times vary)."""
    return f"simulator (virtual time), python {sys.version.split()[0]}"


def write(name: str, doc: dict, fig: object | None = None) -> Path:
    """benchmarks/results/paper/NAME.json (and NAME.png from a matplotlib figure)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **doc}, indent=2, default=float) + "\n")
    if fig is not None:
        fig.savefig(OUT_DIR / f"{name}.png", dpi=110, bbox_inches="tight")  # type: ignore[attr-defined]
    return path


def read(name: str) -> dict:
    """benchmarks/results/paper/NAME.json as `write` left it (a script adding one
    counterfactual to its last full run)."""
    path = OUT_DIR / f"{name}.json"
    if not path.is_file():
        raise SurgeError(f"{path} is missing: run the script once without options first")
    return json.loads(path.read_text())


def only_parts(description: str, parts: tuple[str, ...], argv: list[str] | None) -> list[str]:
    """The `--only PART` options of a script run piece by piece (repeatable; none: [])."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--only",
        action="append",
        choices=parts,
        help="rerun only this piece into the existing JSON (repeatable; default: all)",
    )
    return parser.parse_args(argv).only or []


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def run_main(main: Callable[[], object]) -> int:
    """Run a reproduction's `main`; a missing trace (shared/traces absent or moved) or other
    bad input is one `error:` line naming the fix and exit status 2, with nothing written."""
    try:
        main()
    except SurgeError as exc:
        logging.getLogger("paper").error(
            "error: %s (the paper reproductions replay shared/traces: put it beside the "
            "repository or set SURGE_TRACES)",
            exc,
        )
        return 2
    return 0
