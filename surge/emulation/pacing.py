"""Pacing engine steps to the emulated GPU: each step lasts what the emulated GPU takes.

What flows: an agent's step (a local instance's whole model, or a pipeline stage's layer
range) reports its shape — tokens per sequence (`q_lens`), the real layers it ran and the
real model's layer count — and when it started; `StepPacer.pace` sleeps until the step has
lasted D times the emulated step time, from the simulator's own cost model (`sim/costs.py`
`cost_model`, the same code `surge simulate` times its steps with). A step whose real work
already took longer is a violation: counted (`steps`, `violations`, `overrun_s`) and reported
in the agent's status, `/metrics` and benchmark JSON. An agent is one emulated GPU, which
runs one step at a time (`StepPacer.step`): its local instance's steps and its pipeline
stages' (a BlitzScale live batch's last layers on its partner, §4 Fig. 7 (d)) take turns, as
the simulator's engine runs a live batch after what the partner already has (C2 of Eq. 1).
Whose turn is next is the `turn` rule the agent passes in, `policy.blitzscale.live_step
.next_step` (both bodies'): a live batch's step that reached the agent (`arrive`) goes
before the local instance's next step, the live batches in the order they arrived.
Before 2026-11-29 they ran at once, each at the emulated GPU's full speed: on the emulated
§6.1 7B run a prefill instance prefilled its own batch and a live batch's last 15 of 16
layers together: requests 8-11's first tokens at 1.425 s, the simulator's 1.68 s.
Owned by emulation/; used by the node agent (`runtime/node/instance_loop.py`, `node/serving.py`).
"""

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
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
        turn: Callable[[Sequence[Hashable | None]], tuple[int, ...]] | None = None,
    ) -> None:
        self.model = model
        """The emulated model."""
        self.cost: CostModel = cost_model(model, gpu_profile(gpu))
        self.time_dilation = time_dilation
        self.clock, self.sleep = clock, sleep
        self._counts = PacingCounts()
        self._lock = threading.Lock()  # steps of several instances end in several threads
        self._gpu = threading.Condition()
        """Guards `_busy` and `_arrived`; waited on for the GPU's turn (`step`)."""
        self._busy = False
        """A step holds the emulated GPU."""
        self._arrived: list[Hashable] = []
        """The live batches whose step reached this agent and has not run, in the order
        they arrived (`arrive`)."""
        self._turn = turn
        """Which of the work waiting (live batches' keys in arrival order, None for a step
        of no live batch) goes next: `policy.blitzscale.live_step.next_step`, as the agent
        passes it (`runtime/node/context.step_pacer`); None: whichever step takes the GPU
        first."""

    def arrive(self, live: Hashable) -> None:
        """Live batch `live`'s step reached this agent: from now on the GPU's turns count
        it (`step`), while it still waits for its stage (its compute group's step before
        it) — until 2026-11-29 the local instance's next step took the GPU in that gap (on
        the emulated §6.1 7B run the partner prefilled request 15, routed at 1.604 s,
        before live batch 12-14's last layers, waiting since 1.12). Call `leave` if the
        step will not run."""
        with self._gpu:
            if live not in self._arrived:
                self._arrived.append(live)

    def leave(self, live: Hashable) -> None:
        """Live batch `live`'s step will not run (failed or cancelled before its turn)."""
        with self._gpu:
            if live in self._arrived:
                self._arrived.remove(live)
                self._gpu.notify_all()

    def _my_turn(self, live: Hashable | None) -> bool:
        """Whether the GPU is free and the step of `live` (None: a local instance's or a
        stage's of no live batch) goes next (`_turn`)."""
        if self._busy:
            return False
        if self._turn is None:
            return True
        work = [*self._arrived, None] if live is None else self._arrived
        chosen = self._turn(work)
        return bool(chosen) and work[chosen[0]] == live

    @contextlib.contextmanager
    def step(self, live: Hashable | None = None) -> Iterator[float]:
        """One step on this agent's emulated GPU, from its start (yielded: this pacer's
        clock, for `pace`) to the end of its pacing: a step of another instance or stage of
        this agent waits for it, as on one GPU (a prefill keeps the GPU busy; two at once
        would each take longer). `live`: the live batch whose last layers it runs (it
        arrives now if it did not before); its turn comes as `_turn` says. Call `pace`
        inside it."""
        with self._gpu:
            if live is not None and live not in self._arrived:
                self._arrived.append(live)
            self._gpu.wait_for(lambda: self._my_turn(live))
            self._busy = True
            if live is not None:
                self._arrived.remove(live)
        try:
            yield self.clock()
        finally:
            with self._gpu:
                self._busy = False
                self._gpu.notify_all()

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
