"""The load monitor's bounds in `benchmarks/systems/blitzscale.py`, as users get them.

BlitzScale §5.3 sizes a deployment by per-instance bounds "profiled offline". In `surge serve`
(local agents) they come from the real engine's step profile (`runtime/step_profiles.py`):
read from `$SURGE_HOME/profiles` at deploy time, or taken there in the background while the
deployment serves on the host's estimates. The benchmark measures the first case, the
steady one a user has after `surge model profile STORE` (or after serve's own background
profile finished): `take_profile` runs that command ahead of the timed part into the
benchmark's profile directory, and `wait_for_profile` waits until the deployment's
controller has read it (in its child process, as serve does) and checks it is that one (a
profile measured again would mean the command and serve keep different keys). `--estimates`
is the condition before the profile: no profile directory, the host's estimates.
"""

import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from surge.control.controller import Controller, ControllerConfig
from surge.control.state import Deployment
from surge.policy.blitzscale.monitor import StepProfile
from surge.runtime.step_profiles import parse_profile

log = logging.getLogger("blitzscale")
PROFILE_WAIT_S = 600.0
"""Longest wait for a deployment's controller to read the kept profile (a child process
that imports torch: seconds; a loaded 2-core VM: tens of seconds)."""


def take_profile(store: Path, directory: Path, max_num_seqs: int, nodes: int) -> dict[str, Any]:
    """`surge model profile STORE` in a process of its own, with the engine settings the
    benchmark's controllers give their agents (`ControllerConfig`'s, as `surge serve`'s; on
    the CPU threads of one of its `nodes` local agents),
    kept in `directory`; the file it keeps (its name, steps, mtime) and the seconds taken
    (a profile already kept there: the seconds to read it)."""
    cfg = ControllerConfig(state_dir=directory, max_num_seqs=max_num_seqs, nodes=nodes)
    cmd = [
        sys.executable, "-m", "surge.cli", "model", "profile", str(store),
        "--max-num-seqs", str(cfg.max_num_seqs), "--nodes", str(cfg.nodes),
        "--compile-decode" if cfg.compile_decode else "--no-compile-decode",
        "--fuse-projections" if cfg.fuse_projections else "--no-fuse-projections",
        "--profile-dir", str(directory),
    ]  # fmt: skip
    log.info("taking the step profile ahead: %s", " ".join(cmd[2:]))
    start_s = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    took_s = time.monotonic() - start_s
    if r.returncode != 0:
        raise RuntimeError(f"surge model profile failed: {r.stderr.strip()[-2000:]}")
    files = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    path = files[-1]  # the one it just took or read
    kept = json.loads(path.read_text())
    return {
        "command": " ".join(cmd[3:]),
        "seconds": round(took_s, 1),
        "file": path.name,
        "mtime_ns": path.stat().st_mtime_ns,
        "prefill_s": kept["prefill_s"],
        "decode_s": kept["decode_s"],
        "cli_says": r.stdout.strip().splitlines()[-1],
    }


def kept_steps(kept: dict[str, Any]) -> StepProfile:
    return parse_profile(json.dumps({"prefill_s": kept["prefill_s"], "decode_s": kept["decode_s"]}))


async def wait_for_profile(
    dep: Deployment, kept: dict[str, Any], directory: Path, name: str
) -> float:
    """Seconds until `dep`'s controller has read the profile `take_profile` kept; an error
    if it took another (measured again: a key the command and serve disagree on)."""
    start_s = time.monotonic()
    while dep.step_profile is None:
        if time.monotonic() - start_s > PROFILE_WAIT_S:
            raise RuntimeError(f"{name}: the controller never read the kept step profile")
        await asyncio.sleep(0.05)
    path = directory / kept["file"]
    files = sorted(p.name for p in directory.glob("*.json"))
    if (
        dep.step_profile != kept_steps(kept)
        or files != [kept["file"]]
        or path.stat().st_mtime_ns != kept["mtime_ns"]
    ):
        raise RuntimeError(
            f"{name}: serve measured its own profile ({files}) instead of reading the one "
            "`surge model profile` kept: their keys differ"
        )
    return time.monotonic() - start_s


def bounds_used(ctl: Controller, dep: Deployment) -> dict[str, Any]:
    """Which bounds the deployment's monitor is sized by now, and their values."""
    s = ctl.autoscale_settings(dep)
    if not dep.spec.autoscaling.profile_bounds:
        return {"source": "none (the strategy's monitor profiles no bounds)"}
    return {
        "source": "profile" if dep.step_profile is not None else "estimate",
        "prefill_tokens_per_s": round(s.target_prefill_tokens_per_s or 0.0, 1),
        "prefill_within_s": s.prefill_within_s,
        "decode_tokens_per_s": round(s.target_tokens_per_s or 0.0, 1),
        "kv_usage": s.target_kv_usage,
    }
