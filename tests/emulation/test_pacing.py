"""Pacing: an emulated engine step lasts D times what the emulated GPU takes for the emulated
model at the step's shape (the simulator's cost model), and a step that ran longer is counted."""

import pytest

from surge.emulation import EmulationConfig, StepPacer
from surge.sim.costs import cost_model
from surge.sim.hardware import gpu_profile
from surge.sim.models import load_model


class FakeTime:
    """A clock the test moves, and a sleep that moves it (and records how long it slept)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def pacer(
    d: float = 1.0, gpu: str = "H800", model: str = "llama2-13b"
) -> tuple[StepPacer, FakeTime]:
    t = FakeTime()
    return StepPacer(load_model(model), gpu, d, clock=t.clock, sleep=t.sleep), t


def test_a_step_lasts_the_simulators_step_time_times_d() -> None:
    cost = cost_model(load_model("llama2-13b"), gpu_profile("H800"))
    for d in (1.0, 7.5):
        p, t = pacer(d)
        # a decode step of 8 sequences on the whole model, whose real work took 1 ms
        start = t.clock()
        t.now += 0.001
        paced = p.pace(start, [1] * 8, 0, 4, 4)
        assert paced == pytest.approx(cost.decode_s(8) * d)
        assert t.now - start == pytest.approx(cost.decode_s(8) * d)
        assert t.slept == [pytest.approx(cost.decode_s(8) * d - 0.001)]
        # a prefill of 300 prompt tokens (two sequences)
        start = t.clock()
        p.pace(start, [100, 200], 0, 4, 4)
        assert t.now - start == pytest.approx(cost.prefill_s(300) * d)
    assert p.counts.steps == 2 and p.counts.violations == 0


def test_a_stage_runs_its_share_of_the_emulated_layers() -> None:
    """Real layers [4, 8) of a 16-layer store stand for a quarter of llama2-13b's 40 layers."""
    cost = cost_model(load_model("llama2-13b"), gpu_profile("A10"))
    p, _ = pacer(gpu="A10")
    assert p.emulated_s([1, 1, 1], 4, 8, 16) == pytest.approx(cost.decode_s(3, 10))
    assert p.emulated_s([64], 0, 16, 16) == pytest.approx(cost.prefill_s(64))
    assert p.emulated_s([64], 0, 16, 16) == pytest.approx(4 * p.emulated_s([64], 12, 16, 16))


def test_a_step_that_overran_its_paced_time_is_a_counted_violation() -> None:
    p, t = pacer(d=2.0)
    paced = p.emulated_s([1], 0, 2, 2) * 2.0
    start = t.clock()
    t.now += paced + 0.25  # the real step took longer than the emulated GPU would (x D)
    p.pace(start, [1], 0, 2, 2)
    assert t.slept == []  # no sleep: it is late already
    assert p.counts.steps == 1 and p.counts.violations == 1
    assert p.counts.overrun_s == pytest.approx(0.25)
    start = t.clock()
    p.pace(start, [1], 0, 2, 2)  # an instant step: paced, not a violation
    assert p.counts.steps == 2 and p.counts.violations == 1


def test_a_faster_gpu_and_a_smaller_model_make_shorter_steps() -> None:
    big, _ = pacer(gpu="V100", model="llama2-13b")
    small, _ = pacer(gpu="H800", model="llama2-7b")
    assert small.emulated_s([1] * 4, 0, 8, 8) < big.emulated_s([1] * 4, 0, 8, 8)
    assert EmulationConfig("paraserve-1", "llama2-7b", 3.0).time_dilation == 3.0
