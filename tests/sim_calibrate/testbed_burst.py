"""The burst of `tests/sim/burst_files.burst_sim` on the CPU testbed's host model: keyword
arguments naming a `TestbedHost` field go to the host, the rest to `SimSettings`."""

import dataclasses
from pathlib import Path

from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.policy.systems import SystemConfig
from surge.sim.settings import SimSettings
from tests.sim.burst_files import burst_sim

HOST_FIELDS = frozenset(f.name for f in dataclasses.fields(TestbedHost))


def burst_on_testbed(
    tmp_path: Path, nodes: int, nic_gbps: float, serve: str, **kw: object
) -> tuple[SimSettings, SystemConfig, TestbedHost]:
    """(settings, system, host) of the burst with `kw` split between host and settings."""
    host = TestbedHost(**{k: v for k, v in kw.items() if k in HOST_FIELDS})  # type: ignore[arg-type]
    rest = {k: v for k, v in kw.items() if k not in HOST_FIELDS}
    settings, system = burst_sim(tmp_path, nodes, nic_gbps, serve, **rest)
    return settings, system, host
