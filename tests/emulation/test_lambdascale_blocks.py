"""λScale Fig. 8 / 18 / 17 on the emulated runtime (benchmarks/emulation/lambdascale_blocks.py):
a real scale-out records when each node held each block, in emulated seconds, beside the
simulator's; its agents are gone by PID afterwards; the cells say EMULATED with the setting."""

import argparse
import os

import pytest

from benchmarks.emulation.lambdascale_blocks import run_emulated, run_simulated
from benchmarks.emulation.lambdascale_blocks_cells import block_gaps, report_cells, summarize
from surge.emulation import EmulationConfig

SPEC = "lambdascale-testbed1:llama2-13b"


def _args(tmp_dilation: float = 5.0) -> argparse.Namespace:
    return argparse.Namespace(
        emulate=SPEC, time_dilation=tmp_dilation, layers=4, cluster="loopback", cpu_per_node=None
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(300)
def test_a_scale_out_records_every_blocks_arrival_per_node_in_order() -> None:
    nodes, blocks = 3, 4
    emu = run_emulated(_args(), "lambdascale", nodes, blocks)
    sim = run_simulated(EmulationConfig.parse(SPEC), "lambdascale", nodes, blocks)
    grid = emu["block_arrival_s"]
    assert len(grid) == nodes and all(len(row) == blocks for row in grid)
    assert grid[0] == [0.0] * blocks  # the warm source
    every = [t for row in grid[1:] for t in row]
    assert all(t is not None and t > 0 for t in every)  # every receiver got every block
    assert emu["complete_s"] == max(every)
    for body in (emu, sim):  # node A and B: sorted arrivals, first <= last, one per block
        for at in body["arrival_s"].values():
            assert len(at) == blocks and at == sorted(at)
        assert 0 < body["first_s"] <= body["last_s"] <= body["complete_s"]
    # a block's transfer over the emulated link is paced: it takes emulated time, as in the
    # simulator, and the slowest receiver is the last to be whole
    assert all(g > 0 for g in block_gaps(emu["arrival_s"]["B"]))
    assert max(emu["last_by_node_s"]) == emu["complete_s"]
    assert emu["emulation"]["steps"] > 0 and emu["emulation"]["time_dilation"] == 5.0
    assert emu["agent_pids"] and all(_gone(p) for p in emu["agent_pids"].values())


def _run(system: str, nodes: int, first: float, last: float, bad: int) -> dict:
    def body(f: float, t: float) -> dict:
        return {
            "first_s": f, "last_s": t, "spread_B_s": t - f, "complete_s": t,
            "arrival_s": {"A": [f, t], "B": [f, t]},
        }  # fmt: skip

    emu = body(first, last) | {
        "cluster": "netns",
        "emulation": {
            "violations": bad, "steps": 100, "time_dilation": 80.0,
            "load_average_start": [1.0], "load_average_end": [2.0],
        },
    }  # fmt: skip
    return {"system": system, "nodes": nodes, "blocks": 16, "emulated": emu,
            "simulated": body(first, last)}  # fmt: skip


def test_the_cells_carry_the_setting_the_violations_and_the_papers_claims() -> None:
    runs = {
        f"{s}/{n}/16": _run(s, n, f, t, 1)
        for s, n, f, t in (
            ("lambdascale", 4, 0.03, 0.5), ("lambdascale", 12, 0.03, 0.6),
            ("faasnet", 4, 0.03, 0.6), ("faasnet", 12, 0.03, 1.2),
            ("nccl", 4, 0.13, 0.7), ("nccl", 12, 0.13, 0.9),
        )
    }  # fmt: skip
    report = {"emulate": SPEC, "fig8": runs}
    report["summary"] = summarize(report)
    claims = report["summary"]["fig8"]["claims"]["emulated"]
    assert claims["nccl_first_late"] and claims["lambdascale_last_first"]
    assert claims["faasnet_tail_grows_faster"]  # x2.0 against λScale's x1.2
    (cell,) = report_cells(report)
    assert cell["figure"] == "Fig. 8" and cell["emulated"].startswith(f"EMULATED ({SPEC}, 4/12")
    assert "dilation 80" in cell["emulated"] and "6 of 600 paced steps violated" in cell["emulated"]
