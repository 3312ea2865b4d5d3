"""Pacing engine steps to the emulated GPU: each step lasts what the emulated GPU takes.

What flows: an agent's step (a local instance's whole model, or a pipeline stage's layer
range) reports its shape — tokens per sequence (`q_lens`), the real layers it ran and the
real model's layer count — and when it started; `StepPacer.pace` sleeps until the step has
lasted D times the emulated step time, from the simulator's own cost model (`sim/costs.py`
`cost_model`, the same code `surge simulate` times its steps with). A step whose real work
already took longer is a violation: counted (`steps`, `violations`, `overrun_s`) and reported
in the agent's status, `/metrics` and benchmark JSON. Owned by emulation/; used by the node
agent (`runtime/node/instances.py`, `node/serving.py`).
"""

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from surge.sim.costs import CostModel, cost_model
from surge.sim.hardware import gpu_profile
from surge.sim.models import ModelProfile


@dataclass(frozen=True)
class PacingCounts:
    """A node's paced steps so far."""

    steps: int = 0
    """Engine steps paced."""
    violations: int = 0
    """Steps whose real work took longer than their paced time (the emulation fell behind)."""
    overrun_s: float = 0.0
    """Real seconds the violating steps ran past their paced time, summed."""


class StepPacer:
    """One node's pacing: its emulated GPU running the emulated model, D times slower."""

    def __init__(
        self,
        model: ModelProfile,
        gpu: str,
        time_dilation: float,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        """The emulated model."""
        self.cost: CostModel = cost_model(model, gpu_profile(gpu))
        self.time_dilation = time_dilation
        self.clock, self.sleep = clock, sleep
        self._counts = PacingCounts()
        self._lock = threading.Lock()  # steps of several instances end in several threads

    def emulated_s(
        self, q_lens: Sequence[int], first_layer: int, end_layer: int, real_num_layers: int
    ) -> float:
        """Emulated seconds of one step: a prefill of sum(q_lens) tokens, or (every sequence
        at one token) a decode of len(q_lens) sequences, through the emulated layers that
        stand for real layers [first_layer, end_layer) — the same share of the emulated
        model's layers as of the real model's, so a stage of a quarter of the real layers
        runs a quarter of the emulated ones (the cost model has no context term, so the
        context length does not change a step's time; as in the simulator)."""
        layers = (end_layer - first_layer) * self.cost.num_layers / real_num_layers
        if max(q_lens) == 1:
            return self.cost.decode_s(len(q_lens), layers)  # type: ignore[arg-type]
        return self.cost.prefill_s(sum(q_lens), layers)  # type: ignore[arg-type]

    def pace(
        self,
        started_s: float,
        q_lens: Sequence[int],
        first_layer: int,
        end_layer: int,
        real_num_layers: int,
    ) -> float:
        """Hold the calling (step) thread until the step that began at `started_s` (this
        pacer's clock) has lasted its paced time; returns that time in real seconds."""
        paced_s = self.emulated_s(q_lens, first_layer, end_layer, real_num_layers)
        paced_s *= self.time_dilation
        elapsed_s = self.clock() - started_s
        over_s = elapsed_s - paced_s
        with self._lock:
            c = self._counts
            self._counts = PacingCounts(
                c.steps + 1,
                c.violations + (over_s > 0),
                c.overrun_s + max(0.0, over_s),
            )
        if over_s < 0:
            self.sleep(-over_s)
        return paced_s

    @property
    def counts(self) -> PacingCounts:
        return self._counts
