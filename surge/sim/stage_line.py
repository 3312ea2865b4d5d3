"""A pipeline's stages, shared by its micro-batches' head engines: when a step leaves them.

In: a step a head engine (`sim/batching.py` `Batcher`) starts now, as its compute through
every layer of the pipeline (seconds). Out: when it leaves the last stage. Each stage
computes one step at a time, in the order steps reach it, and takes its 1/num_stages share
of the step's compute; an activation hop (`hop_s`) separates consecutive stages and holds
neither. As in the runtime (`runtime/node/serving.py`: a stage holds its lock only while it
computes; one head engine per micro-batch, `runtime/pipeline_endpoint.py`), a micro-batch's decode
step that reaches a stage while another micro-batch's prefill is there waits for it.
Steps start in time order, and every step crosses the same stages and hops, so a step that
starts later reaches every stage later: reserving the stages when a step starts is their
first-come-first-served order. Owned by sim/ (`sim/serving_engine.py` makes one per
pipeline).
"""


class StageLine:
    """The stages of one pipeline and when each is next free."""

    __slots__ = ("free_s", "hop_s")

    def __init__(self, num_stages: int, hop_s: float = 0.0, now_s: float = 0.0) -> None:
        self.free_s = [now_s] * max(1, num_stages)
        """When each stage has computed every step that reached it so far."""
        self.hop_s = hop_s
        """One activation hop between two consecutive stages (seconds)."""

    @property
    def num_stages(self) -> int:
        return len(self.free_s)

    def pass_through(self, start_s: float, work_s: float) -> float:
        """A step of `work_s` compute (every layer) starting at `start_s`: when it leaves the
        last stage. Reserves each stage for its share, in turn."""
        free = self.free_s
        hop = self.hop_s
        share = work_s / len(free)
        t = start_s - hop
        for k, f in enumerate(free):  # once per step of every micro-batch: kept lean
            t += hop
            t = (t if t >= f else f) + share  # max(t + hop, f) + share
            free[k] = t
        return t

    def reshape(self, num_stages: int, now_s: float) -> None:
        """The pipeline now has `num_stages` stages (a refactoring): none free before the
        steps already reserved on the old ones are done."""
        busy_until = max([now_s, *self.free_s])
        self.free_s = [busy_until] * max(1, num_stages)

    def clear(self, now_s: float) -> None:
        """Every step was abandoned (the engine drained): every stage free now."""
        self.free_s = [now_s] * len(self.free_s)
