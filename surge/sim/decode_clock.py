"""A head engine's step clock: when its prefill and decode steps end, as events.

In: from the engine's batcher (`sim/batching.py` `Batcher`, which holds one and decides
what each step runs), its cost model, speed, compute share and hop, its pipeline's shared
stages if any, its decode batch and waiting queue (the batcher's, shared), and three
callbacks: a request finished, a decode step ended, a prefill step ended. Out: the events
that end steps, the requests each decode step finishes, the KV-full preemptions, and the
clock the batcher's admission and load signals read (`phase`, `v`, `v_time_s`, `step_s`).

Event-light (O(1) events per request): between changes of the running set every decode step
has the same batch, so running requests advance at 1/step_s tokens per second: a decode clock
V (tokens each has generated since V = 0) and a heap of the V at which each finishes
(`sim/decode_batch.py`); only the next finish is scheduled, or the step that finds the cache
full if that comes first: it preempts the latest admitted, as vLLM does. A prefill step's
time left is kept at rate 1 (`speed` x `share` 1), so a rate change reschedules it. Over a
pipeline's shared stages (`sim/stage_line.py`) each step is an event instead: it ends when
the stages, one step at a time each, have passed it through. Owned by sim/.
"""

from collections import deque
from collections.abc import Callable

from surge.sim.decode_batch import EPS_TOKENS, DecodeBatch
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import Event, EventLoop, Priority
from surge.sim.held import HeldCount, without_first_token
from surge.sim.request import SimRequest
from surge.sim.stage_line import StageLine
from surge.sim.step_admission import decode_step_left

IDLE, PREFILL, DECODE = 0, 1, 2
INSTANCE = Priority.INSTANCE
"""Its events' class, the member itself (read off the enum class at every step, a member
costs ~10x a module global)."""


class DecodeClock:
    """One head engine's steps as events: decode steps, finishes, KV-full preemptions and
    the prefill step in flight (its `Batcher` admits, prefills and hands requests on)."""

    __slots__ = (
        "_decode_step_s",
        "_on_finished",
        "_on_prefill_end",
        "_on_step_end",
        "_prefill_left_s",
        "_prefill_rate",
        "cost",
        "decode_v0",
        "event",
        "held",
        "hop_s",
        "id",
        "loop",
        "phase",
        "running",
        "share",
        "speed",
        "stages",
        "step_s",
        "stepping",
        "v",
        "v_time_s",
        "waiting",
    )

    def __init__(
        self,
        iid: int,
        loop: EventLoop,
        spec: EngineSpec,
        running: DecodeBatch,
        waiting: deque[SimRequest],
        on_finished: Callable[[SimRequest], None],
        on_step_end: Callable[[], None],
        on_prefill_end: Callable[[], None],
        held: HeldCount,
    ) -> None:
        self.id = iid
        self.loop = loop
        self.cost = spec.cost
        self.speed = spec.speed
        self.hop_s = spec.hop_s
        self.running = running
        """The requests decoding and the KV tokens held (the batcher's)."""
        self.waiting = waiting
        """The batcher's queue: a KV-full step puts the requests it preempts first in it."""
        self._on_finished = on_finished
        self._on_step_end = on_step_end
        """After a decode step's end and its finishes: the batcher starts the next step."""
        self._on_prefill_end = on_prefill_end
        self.held = held
        """The endpoint's count of held requests: finished ones leave it (`sim/held.py`)."""
        self.phase = IDLE
        self.v = 0.0
        self.v_time_s = 0.0
        self.decode_v0 = 0.0
        """V when the decode phase under way began: its steps end at V = decode_v0 + k."""
        self.step_s = 0.0
        self.event: Event | None = None
        """Its step's end (or next finish) scheduled, if any."""
        self._decode_step_s: dict[int, float] = {}
        """`cost.decode_s` by batch size, as computed (a staged pipeline asks at every
        step; the cost model never changes)."""
        self.share = 1.0
        """Fraction of a compute unit this engine gets now (host compute sharing)."""
        self._prefill_left_s = 0.0
        self._prefill_rate = 1.0
        self.stepping = False
        """A step's end is handled: work handed over meanwhile joins the next step together."""
        self.stages: StageLine | None = None
        """Stages shared with other micro-batches (None: every layer at once, then `hop_s`)."""

    # --- the batcher's calls ------------------------------------------------------
    def settle(self) -> None:
        """Bring V (or the prefill's time left) to now."""
        now = self.loop.now_s
        if now == self.v_time_s:  # settled at this instant already (a step's end: twice)
            return
        if self.phase == DECODE and self.step_s > 0:
            self.v += (now - self.v_time_s) / self.step_s
        elif self.phase == PREFILL:
            # Remaining prefill time at rate 1 (compute, then the hop).
            self._prefill_left_s -= (now - self.v_time_s) * self._prefill_rate
            self._prefill_left_s = max(self._prefill_left_s, 0.0)
        self.v_time_s = now

    def step_in_flight(self) -> bool:
        """Whether a prefill (or staged step) is in flight: restarting would drop its batch
        (or reserve stages twice)."""
        return self.event is not None and (self.phase == PREFILL or self.stages is not None)

    def cancel(self) -> None:
        """Drop the step end scheduled, if any."""
        if self.event is not None:
            self.event.cancel()
            self.event = None

    def end_step_at(self, at_s: float) -> None:
        """End the decode step under way at `at_s` (waiting work starts then)."""
        if self.event is not None:
            self.event.cancel()
        self.event = self.loop.schedule(at_s, INSTANCE, self.id, self._on_decode_done)

    def prefill(self, batch: list[SimRequest]) -> None:
        """Time a prefill step of `batch` from now (scheduled by `schedule_prefill`, once
        the batcher has turned busy): work in seconds at rate 1, hop included at the
        current rate (after a rate change the hop scales too: one number for compute +
        hop)."""
        self.cancel()
        rate = self.speed * self.share
        work_s, now = self._prefill_work_s(batch), self.loop.now_s
        if self.stages is not None:  # through the shared stages, in their turn
            self._prefill_left_s = (self.stages.pass_through(now, work_s / rate) - now) * rate
        else:
            self._prefill_left_s = work_s + self.hop_s * rate

    def schedule_prefill(self) -> None:
        self._prefill_rate = self.speed * self.share
        at = self.loop.now_s + self._prefill_left_s / self._prefill_rate
        self.event = self.loop.schedule(at, INSTANCE, self.id, self._on_prefill)

    def schedule_decode(self) -> None:
        """Schedule the running batch's next event: its next finish, or the step that finds
        the cache full (staged: its next step's end)."""
        if self.event is not None:
            self.event.cancel()
        if self.stages is not None:  # one step, through the shared stages
            if self.running.full_at_v(self.v, self.decode_v0) <= self.v + EPS_TOKENS:
                self._preempt()  # this step has no room for every new token
            now = self.loop.now_s
            self.step_s = self.stages.pass_through(now, self._decode_work_s()) - now
            self.event = self.loop.schedule(
                now + self.step_s, INSTANCE, self.id, self._on_decode_done
            )
            return
        self.step_s = self._decode_work_s() + self.hop_s
        finish_v = self.running.next_finish_v
        full_v = self.running.full_at_v(self.v, self.decode_v0)
        if full_v < finish_v - EPS_TOKENS:  # the cache fills first: a step preempts
            at = self.v_time_s + max(full_v - self.v, 0.0) * self.step_s
            self.event = self.loop.schedule(at, INSTANCE, self.id, self._on_kv_full)
            return
        at = self.v_time_s + max(finish_v - self.v, 0.0) * self.step_s
        self.event = self.loop.schedule(at, INSTANCE, self.id, self._on_decode_done)

    def set_rate(self, speed: float, share: float, hop_s: float) -> bool:
        """Run at `speed` x `share` with a per-step hop `hop_s` from now on: the step under
        way ends at the new rate (a staged one holds its stages; the next runs at it).
        True: a decode step's end moved (work waiting for it starts then)."""
        self.settle()
        self.speed, self.share, self.hop_s = speed, share, hop_s
        if self.stages is not None:
            return False
        if self.phase == DECODE:
            self.schedule_decode()
            return True
        if self.phase == PREFILL and self.event is not None:
            self.event.cancel()
            self.schedule_prefill()
        return False

    def use_stages(self, stages: StageLine) -> None:
        """Step through `stages` from the next step on: a decode phase under way ends when
        its step does."""
        if self.phase == DECODE:
            self.settle()
            self.end_step_at(self.v_time_s + decode_step_left(self.v, self.decode_v0) * self.step_s)
        self.stages = stages

    # --- internals ----------------------------------------------------------------
    def _decode_work_s(self) -> float:
        n = len(self.running)
        step_s = self._decode_step_s.get(n)
        if step_s is None:  # the same float `cost.decode_s` gives, once per batch size
            step_s = self._decode_step_s[n] = self.cost.decode_s(n)
        return step_s / (self.speed * self.share)

    def _prefill_work_s(self, batch: list[SimRequest]) -> float:
        """Compute of one prefill step; a live-scaled request runs only its last layers."""
        if all(r.skip_layers == 0 for r in batch):
            return self.cost.prefill_s(sum(r.prefill_tokens for r in batch))
        n = self.cost.num_layers
        return self.cost.prefill_parts_s([(r.prefill_tokens, n - r.skip_layers) for r in batch])

    def _on_prefill(self) -> None:
        self.event = None
        self.v_time_s = self.loop.now_s
        self._on_prefill_end()

    def _on_decode_done(self) -> None:
        self.event = None
        now = self.loop.now_s
        if now != self.v_time_s:  # `settle`, its decode case inline (once per step)
            if self.phase == DECODE and self.step_s > 0:
                self.v += (now - self.v_time_s) / self.step_s
                self.v_time_s = now
            else:
                self.settle()
        done = self.running.pop_finished(self.v)
        if done:  # most steps of a long decode finish nothing
            self.held.n -= len(done)  # all out of the batch before the first callback
            self.stepping = True
            try:
                for req in done:
                    self._on_finished(req)
            finally:
                self.stepping = False
        self._on_step_end()

    def _on_kv_full(self) -> None:
        """A decode step starts with the cache full: the latest admitted wait to be
        recomputed, the rest decode; admission resumes at the step's end (the engine's)."""
        self.event = None
        self.settle()
        self._preempt()
        self.schedule_decode()
        if self.event is not None and self.waiting:
            at = min(self.event.time_s, self.v_time_s + self.step_s)
            self.event.cancel()
            self.event = self.loop.schedule(at, INSTANCE, self.id, self._on_decode_done)

    def _preempt(self) -> None:
        back = self.running.preempt(self.v)
        for req in back:  # the earliest ends up first
            self.waiting.appendleft(req)
        self.held.prompt_tokens += without_first_token(back)  # none: each had its first
