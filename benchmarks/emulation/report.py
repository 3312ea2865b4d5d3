"""The emulated system benchmarks' result files (`blitzscale.py`, `flexpipe.py`): what every
JSON starts with (`report_head`: the EMULATED label, D, the settings, the paper's numbers,
the machine), the runs finished so far kept for `--resume` (`save_partial`, `load_partial`,
outside benchmarks/results/ so a run cut off leaves no second result file there), and the
final JSON and figure (`write_report`). What flows: the run's arguments and its records in;
files out. Owned by benchmarks/emulation/.
"""

import argparse
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import machine
from surge.emulation import EmulationConfig

log = logging.getLogger("emulation_report")


def report_settings(args: argparse.Namespace) -> dict[str, str]:
    """The run's settings as the JSON records them (not where it writes, nor `--resume`,
    nor which systems, statics and CVs run: a resumed run may finish those left)."""
    skip = ("json", "png", "resume", "systems", "statics", "cvs", "store")
    return {k: str(v) for k, v in vars(args).items() if k not in skip}


def report_head(args: argparse.Namespace, config: EmulationConfig, paper: dict) -> dict:
    """What every emulated system benchmark's JSON starts with: the label, D, the settings,
    the paper's numbers and the machine (its load when the run starts)."""
    return {
        "label": "EMULATED: real agents paced as the emulated cluster (docs/emulation.md)",
        "emulate": config.spec,
        "time_dilation": args.time_dilation,
        "nodes": args.nodes,
        "settings": report_settings(args),
        "times": "emulated seconds (real / time_dilation)",
        "paper": paper,
        "machine": machine(args) | {"load_average_start": os.getloadavg()},
    }


def partial_path(args: argparse.Namespace) -> Path:
    """Where the runs finished so far are kept: `$TMPDIR/<json stem>.partial.json` (not
    beside the results: a run cut off leaves no second result file there)."""
    return Path(tempfile.gettempdir()) / f"{args.json.stem}.partial.json"


def save_partial(args: argparse.Namespace, emulated: dict, **extra: Any) -> Path:
    """The runs finished so far (and `extra` fields) at `partial_path`; returns it."""
    path = partial_path(args)
    doc = {"partial": True, "settings": report_settings(args), "emulated": emulated} | extra
    path.write_text(json.dumps(doc, indent=1) + "\n")
    log.info("runs so far: %s", path)
    return path


def load_partial(args: argparse.Namespace) -> dict:
    """What `save_partial` kept from an earlier invocation with the same settings
    (`--resume`: its finished runs are not run again); {} when there is none or its
    settings differ."""
    path = partial_path(args)
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if doc.get("settings") != report_settings(args):
        log.warning("%s was written with other settings: starting afresh", path)
        return {}
    return doc


def write_report(
    args: argparse.Namespace, report: dict, plot: Callable[[dict, Path], None]
) -> None:
    """The result JSON at `--json` (the host's load at the end added), the figure at
    `--png` if asked."""
    if report["machine"].get("load_average_start") is not None:
        report["machine"]["load_average_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.png:
        plot(report, args.png)
