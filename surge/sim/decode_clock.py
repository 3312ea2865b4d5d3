"""A head engine's clock and its decode-step events: when decode steps end, requests finish
and a full KV cache preempts.

In: from the engine's batcher (`sim/batching.py` `Batcher`, this class's one subclass), its
requests joining the decode batch, its speed, compute share and hop, and its pipeline's shared
stages if any. Out: the events that end decode steps, each request's finish (`on_done`), and
the clock the batcher's admission and load signals read (`v`, `v_time_s`, `step_s`).

Event-light (O(1) events per request): between changes of the running set every decode step
has the same batch, so running requests advance at 1/step_s tokens per second: a decode clock
V (tokens each has generated since V = 0) and a heap of the V at which each finishes
(`sim/decode_batch.py`); only the next finish is scheduled, or the step that finds the cache
full if that comes first: it preempts the latest admitted, as vLLM does. Over a pipeline's
shared stages (`sim/stage_line.py`) each step is an event instead: it ends when the stages,
one step at a time each, have passed it through. Owned by sim/.
"""

from collections import deque
from collections.abc import Callable
from typing import Self

from surge.sim.decode_batch import EPS_TOKENS, DecodeBatch
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import Event, EventLoop, Priority
from surge.sim.request import SimRequest
from surge.sim.stage_line import StageLine

IDLE, PREFILL, DECODE = 0, 1, 2


class DecodeClock:
    """One head engine's clock: decode steps, finishes and KV-full preemptions as events
    (the `Batcher` adds admission, prefill and its entry points)."""

    __slots__ = (
        "_event",
        "_prefill_left_s",
        "_prefill_rate",
        "_stepping",
        "cost",
        "decode_v0",
        "hop_s",
        "id",
        "loop",
        "on_done",
        "phase",
        "running",
        "share",
        "speed",
        "stages",
        "step_s",
        "tokens_done",
        "v",
        "v_time_s",
        "waiting",
    )

    def __init__(
        self,
        iid: int,
        loop: EventLoop,
        spec: EngineSpec,
        on_done: Callable[[Self, SimRequest], None],
    ) -> None:
        self.id = iid
        self.loop = loop
        self.cost = spec.cost
        self.on_done = on_done
        self.speed = spec.speed
        self.hop_s = spec.hop_s
        self.waiting: deque[SimRequest] = deque()
        self.running = DecodeBatch(spec.kv_capacity_tokens)
        """The requests decoding and the KV tokens held (by prompt, as vLLM admits)."""
        self.phase = IDLE
        self.v = 0.0
        self.v_time_s = 0.0
        self.decode_v0 = 0.0
        """V when the decode phase under way began: its steps end at V = decode_v0 + k."""
        self.step_s = 0.0
        self._event: Event | None = None
        self.tokens_done = 0
        self.share = 1.0
        """Fraction of a compute unit this engine gets now (host compute sharing)."""
        self._prefill_left_s = 0.0
        self._prefill_rate = 1.0
        self._stepping = False
        """A step's end is handled: work handed over meanwhile joins the next step together."""
        self.stages: StageLine | None = None
        """Stages shared with other micro-batches (None: every layer at once, then `hop_s`)."""

    def _advance(self) -> None:
        """Start the engine's next step (the `Batcher`'s: prefill, decode or idle)."""
        raise NotImplementedError

    def _settle(self) -> None:
        now = self.loop.now_s
        if self.phase == DECODE and self.step_s > 0:
            self.v += (now - self.v_time_s) / self.step_s
        elif self.phase == PREFILL:
            # Remaining prefill time at rate 1 (compute, then the hop).
            self._prefill_left_s -= (now - self.v_time_s) * self._prefill_rate
            self._prefill_left_s = max(self._prefill_left_s, 0.0)
        self.v_time_s = now

    def _decode_work_s(self) -> float:
        return self.cost.decode_s(len(self.running)) / (self.speed * self.share)

    def _schedule_decode(self) -> None:
        if self._event is not None:
            self._event.cancel()
        if self.stages is not None:  # one step, through the shared stages
            if self.running.full_at_v(self.v, self.decode_v0) <= self.v + EPS_TOKENS:
                self._preempt()  # this step has no room for every new token
            now = self.loop.now_s
            self.step_s = self.stages.pass_through(now, self._decode_work_s()) - now
            self._event = self.loop.schedule(
                now + self.step_s, Priority.INSTANCE, self.id, self._on_decode_done
            )
            return
        self.step_s = self._decode_work_s() + self.hop_s
        finish_v = self.running.next_finish_v
        full_v = self.running.full_at_v(self.v, self.decode_v0)
        if full_v < finish_v - EPS_TOKENS:  # the cache fills first: a step preempts
            at = self.v_time_s + max(full_v - self.v, 0.0) * self.step_s
            self._event = self.loop.schedule(at, Priority.INSTANCE, self.id, self._on_kv_full)
            return
        at = self.v_time_s + max(finish_v - self.v, 0.0) * self.step_s
        self._event = self.loop.schedule(at, Priority.INSTANCE, self.id, self._on_decode_done)

    def _join(self, req: SimRequest) -> None:
        left = req.output_tokens - req.generated
        if left <= 0:
            self._finish(req)
            return
        self.running.join(req, self.v + left)

    def _finish(self, req: SimRequest) -> None:
        req.done_s = max(self.loop.now_s, req.first_token_s)
        req.generated = req.output_tokens
        self.tokens_done += req.output_tokens
        self.on_done(self, req)

    def _on_decode_done(self) -> None:
        self._event = None
        self._settle()
        self._stepping = True
        try:
            for req in self.running.pop_finished(self.v):
                self._finish(req)
        finally:
            self._stepping = False
        self._advance()

    def _on_kv_full(self) -> None:
        """A decode step starts with the cache full: the latest admitted wait to be
        recomputed, the rest decode; admission resumes at the step's end (the engine's)."""
        self._event = None
        self._settle()
        self._preempt()
        self._schedule_decode()
        if self._event is not None and self.waiting:
            at = min(self._event.time_s, self.v_time_s + self.step_s)
            self._event.cancel()
            self._event = self.loop.schedule(at, Priority.INSTANCE, self.id, self._on_decode_done)

    def _preempt(self) -> None:
        for req in self.running.preempt(self.v):  # the earliest ends up first
            self.waiting.appendleft(req)
