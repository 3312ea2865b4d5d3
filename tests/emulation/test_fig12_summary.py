"""λScale Fig. 12 on the emulation (`benchmarks/emulation/lambdascale_fig12.py`): each system's
all-served time over λScale's, emulated and simulated, the simulator's error, the emulated
order, and a report cell that names what was not run."""

import pytest

from benchmarks.emulation.lambdascale_fig12 import SYSTEMS, plan_of, report_cell, summarize


def _run(emulated_s: float, simulated_s: float) -> dict:
    def body(t: float) -> dict:
        return {"ttft_max_s": t, "ttft_p50_s": t / 2, "ttft_p90_s": t * 0.9}

    emu = body(emulated_s) | {"emulation": {"violation_rate": 0.0}}
    return {"emulated": emu, "simulated": body(simulated_s)}


def test_ratios_errors_order_and_what_was_not_run() -> None:
    report = {
        "emulate": "lambdascale-testbed1:llama2-13b",
        "nodes": 12,
        "time_dilation": 80.0,
        "requests": 50,
        "systems": {
            "lambdascale": _run(0.5, 0.45),
            "faasnet": _run(1.0, 1.1),
            "nccl": _run(0.7, 0.7),
        },
    }
    report["summary"] = s = summarize(report)
    assert s["over_lambdascale"]["emulated"] == {"faasnet": 2.0, "nccl": 1.4}
    assert s["over_lambdascale"]["simulated"]["faasnet"] == pytest.approx(1.1 / 0.45, abs=1e-3)
    assert s["sim_error"]["lambdascale"]["ttft_max_s"] == pytest.approx(-0.1)
    assert s["order_emulated"] == ["lambdascale", "nccl", "faasnet"]
    (cell,) = report_cell(report)
    assert (cell["paper"], cell["figure"]) == ("λScale", "Fig. 12")
    assert "EMULATED" in cell["emulated"] and "not run: serverlessllm-ssd" in cell["emulated"]


def test_a_system_run_at_its_own_dilation_says_so() -> None:
    """ServerlessLLM-SSD's disk load is pure pacing: it may run at a lower D than the rest
    (resumed into the same JSON); the summary, the cell and the figure name each D."""
    ssd = _run(4.0, 3.6)
    ssd["emulated"]["emulation"]["time_dilation"] = 40.0
    report = {
        "emulate": "lambdascale-testbed1:llama2-13b",
        "nodes": 12,
        "time_dilation": 80.0,
        "requests": 50,
        "systems": {"lambdascale": _run(0.5, 0.45), "serverlessllm-ssd": ssd},
    }
    report["summary"] = s = summarize(report)
    assert s["time_dilation"] == {"lambdascale": 80.0, "serverlessllm-ssd": 40.0}
    assert s["over_lambdascale"]["emulated"] == {"serverlessllm-ssd": 8.0}
    (cell,) = report_cell(report)
    assert "dilation 80, serverlessllm-ssd at 40," in cell["emulated"]


def test_every_system_has_a_plan_and_an_unknown_one_is_refused() -> None:
    modes = {name: plan_of(name)[1] for name in SYSTEMS}
    assert modes["lambdascale"] == "execute_while_load"
    assert plan_of("nccl")[0].group_setup_s > 0  # the simulator's communicator creation
    assert plan_of("nccl")[0].multicast_transport == "gloo-ring"  # a real group, NCCL's ring
    assert plan_of("nccl-tree")[0].multicast_transport == "gloo"  # gloo's own broadcast
    assert plan_of("serverlessllm-ssd")[2] == "disk"
    with pytest.raises(ValueError, match="unknown system"):
        plan_of("tetris")


def test_the_cell_says_how_nccl_ran_and_its_measured_group_set_up() -> None:
    """An NCCL run through a real gloo group (netns) reports its group's (paced) creation and
    how long the real group took to form; one from before (the chain plus the modelled
    set-up) says it was not gloo."""
    nccl = _run(0.9, 0.85)
    report = {
        "emulate": "lambdascale-testbed1:llama2-13b",
        "nodes": 12,
        "time_dilation": 80.0,
        "requests": 50,
        "systems": {"lambdascale": _run(0.5, 0.45), "nccl": nccl},
    }
    report["summary"] = summarize(report)
    assert "NCCL as chain + group set-up, not gloo" in report_cell(report)[0]["emulated"]
    nccl["emulated"] |= {
        "cluster": "netns",
        "group": {
            "setup_s": 0.1,
            "setup_real_s": 8.0,
            "member_setup_real_s": [0.05, 0.25, None],
            "fell_back": False,
        },
    }
    report["summary"] = s = summarize(report)
    assert s["cluster"] == {"lambdascale": "loopback", "nccl": "netns"}
    cell = report_cell(report)[0]["emulated"]
    assert "NCCL as gloo's binomial-tree broadcast in a real gloo group on netns (group " in cell
    assert "set-up 100.0 ms emulated; the real group formed in 0.25 s real; sim 0.1 s" in cell
    nccl["emulated"]["transport"] = "gloo-ring"
    assert "NCCL as NCCL's ring in a real gloo" in report_cell(report)[0]["emulated"]
