"""Continuous batching with O(1) events per request: one head engine's admission and prefill.

In: requests its endpoint's `ServingEngine` (`sim/serving_engine.py`: one head per
micro-batch) submits, a `CostModel`, limits, a speed factor, a per-step hop cost or the
pipeline's shared stages. Out: callbacks when a request gets its first token, is done, or
(prefill role) leaves for a decode instance. It knows nothing of GPUs, pools or loading.

Cost model, event-light: at a step boundary (`sim/step_admission.py`) a prefill step admits
waiting requests (batch, KV and `max_prefill_tokens` limits) and takes
cost.prefill_s(tokens)/speed + hop; decode waits meanwhile (prefill-first, as vLLM). Decode
is its base class's (`sim/decode_clock.py` `DecodeClock`): a decode clock V, only the next
finish scheduled, O(1) events per request. KV as vLLM holds it (`sim/decode_batch.py`): a
request is admitted by its prompt, and the step that finds the cache full preempts the latest
admitted. Compute sharing: `share` (a host model's cores shared by endpoints, `sim/host.py`;
1.0 on a real cluster) multiplies the speed of every step, a prefill in flight rescheduled at
the new rate; `on_busy(engine)` is called as it turns busy or idle. Over a pipeline's shared
stages (`stages`, `sim/stage_line.py`) each step is an event. Roles: `both` and `decode` serve
a request to its end, `prefill` hands it on after its first token (`on_prefilled`, P/D
disaggregation); a request whose KV cache came with it (`SimRequest.kv_ready`, a P/D
hand-off) joins the decode batch without a prefill; `resume` keeps a request this engine
prefilled to decode it here.
"""

from collections import deque
from collections.abc import Callable
from typing import Self

from surge.policy.blitzscale.pd import decodes_where_prefilled
from surge.sim.decode_clock import DECODE, IDLE, PREFILL, DecodeClock
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop, Priority
from surge.sim.request import SimRequest
from surge.sim.stage_line import StageLine
from surge.sim.step_admission import admissible, decode_step_left

ADMISSIONS_KEPT = 4096
"""Admission times an engine keeps (BlitzScale's drain rate looks at the last 2 s)."""


class Batcher(DecodeClock):
    """One head engine's continuous batching (`ServingEngine` runs one per micro-batch)."""

    __slots__ = (
        "admitted_s",
        "idle_since_s",
        "kv_capacity_tokens",
        "max_batch",
        "max_prefill_tokens",
        "on_busy",
        "on_prefilled",
        "prefilling",
        "role",
    )

    def __init__(
        self,
        iid: int,
        loop: EventLoop,
        spec: EngineSpec,
        on_done: Callable[[Self, SimRequest], None],
        on_prefilled: Callable[[Self, SimRequest], None],
    ) -> None:
        super().__init__(iid, loop, spec, on_done)
        self.role = spec.role
        self.max_batch = spec.max_batch
        self.kv_capacity_tokens = spec.kv_capacity_tokens
        self.max_prefill_tokens = spec.max_prefill_tokens
        self.on_prefilled = on_prefilled
        self.admitted_s: deque[float] = deque(maxlen=ADMISSIONS_KEPT)
        """When the latest requests left `waiting` (BlitzScale's SLO check's drain rate)."""
        self.prefilling: list[SimRequest] = []
        self.idle_since_s: float | None = loop.now_s
        self.on_busy: Callable[[Self], None] | None = None
        """Called when the engine turns busy or idle (compute sharing)."""

    # --- load signals -------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Requests waiting, prefilling or decoding here."""
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    @property
    def kv_tokens(self) -> float:
        """KV-cache tokens its requests hold now."""
        v = self.v
        if self.phase == DECODE and self.step_s > 0:
            v += (self.loop.now_s - self.v_time_s) / self.step_s
        return self.running.held_tokens(v)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens it generates per second now (every running request, one per step)."""
        if self.phase != DECODE or self.step_s <= 0:
            return 0.0
        return len(self.running) / self.step_s

    # --- entry points -------------------------------------------------------------
    def submit(self, req: SimRequest, start: bool = True) -> None:
        """Take a request (from the router, or a decode hand-off with its KV cache);
        `start` False: the caller hands it more at this instant and then calls `start`."""
        self.idle_since_s = None
        self.waiting.append(req)
        if start:
            self.start()

    def submit_many(self, reqs: list[SimRequest]) -> None:
        """Take several requests at once (admitted together)."""
        for req in reqs:
            self.submit(req, start=False)
        if reqs:
            self.start()

    def start(self) -> None:
        """Waiting work starts at the engine's next step boundary (`sim/step_admission.py`):
        now when idle, when the prefill in flight ends, else when the decode step ends."""
        if self.phase == PREFILL or self._stepping:
            return
        if self.stages is not None and self.phase == DECODE:
            return  # every staged step's end is an event: it admits the waiting work
        left = 0.0
        if self.phase == DECODE and self.waiting:
            self._settle()
            left = decode_step_left(self.v, self.decode_v0)
        if left <= 0:
            self._advance()
            return
        if self._event is not None:
            self._event.cancel()
        at = self.v_time_s + left * self.step_s
        self._event = self.loop.schedule(at, Priority.INSTANCE, self.id, self._on_decode_done)

    def resume(self, req: SimRequest) -> None:
        """Decode here a request this engine prefilled and handed on (`on_prefilled`):
        P/D with no decode instance, or the hand-off target is this engine itself."""
        self.idle_since_s = None
        self._settle()
        self._join(req)
        if self.phase != PREFILL:  # a prefill in flight advances when it ends
            self._advance()

    @property
    def busy(self) -> bool:
        """Whether a prefill or decode step is under way."""
        return self.phase != IDLE

    def set_speed(self, speed: float) -> None:
        """Change relative speed (live loading finished, pipeline hop changed)."""
        self._rate_change(lambda: setattr(self, "speed", speed))

    def set_hop(self, hop_s: float) -> None:
        """Change the per-step activation hop (a pipeline's stages changed)."""
        self._rate_change(lambda: setattr(self, "hop_s", hop_s))

    def use_stages(self, stages: StageLine) -> None:
        """Step through `stages` (shared with other micro-batches; they charge the hops)
        from its next step on: a decode phase under way ends when its step does."""
        self.set_hop(0.0)
        if self.phase == DECODE:
            self._settle()
            if self._event is not None:
                self._event.cancel()
            at = self.v_time_s + decode_step_left(self.v, self.decode_v0) * self.step_s
            self._event = self.loop.schedule(at, Priority.INSTANCE, self.id, self._on_decode_done)
        self.stages = stages

    def set_share(self, share: float) -> None:
        """Change the fraction of a compute unit this engine gets (0 < share <= 1)."""
        self._rate_change(lambda: setattr(self, "share", share))

    def _rate_change(self, change: Callable[[], None]) -> None:
        self._settle()
        change()
        if self.stages is not None:
            return  # the step under way holds its stages; the next runs at the new rate
        if self.phase == DECODE:
            self._schedule_decode()
            if self.waiting:  # it waits for the step's end: when that ends at the new rate
                self.start()
        elif self.phase == PREFILL and self._event is not None:
            self._event.cancel()
            self._schedule_prefill()

    def _set_phase(self, phase: int) -> None:
        was = self.phase != IDLE
        self.phase = phase
        if self.on_busy is not None and was != (phase != IDLE):
            self.on_busy(self)

    def drain(self) -> list[SimRequest]:
        """Stop serving: return every unfinished request, marked for KV recomputation."""
        self._settle()
        if self._event is not None:
            self._event.cancel()
            self._event = None
        out = [*self.prefilling, *self.running.drain(self.v), *self.waiting]
        self.waiting.clear()
        self.prefilling.clear()
        self._set_phase(IDLE)
        return out

    # --- internals ----------------------------------------------------------------
    def _schedule_prefill(self) -> None:
        self._prefill_rate = self.speed * self.share
        at = self.loop.now_s + self._prefill_left_s / self._prefill_rate
        self._event = self.loop.schedule(at, Priority.INSTANCE, self.id, self._on_prefill)

    def _admit(self) -> list[SimRequest]:
        """Waiting requests that fit now (`step_admission.admissible`)."""
        n = admissible(
            self.waiting,
            len(self.running),
            self.kv_tokens,
            self.max_batch,
            self.kv_capacity_tokens,
            self.max_prefill_tokens,
        )
        batch = [self.waiting.popleft() for _ in range(n)]
        self.admitted_s.extend([self.loop.now_s] * n)
        return batch

    def _advance(self) -> None:
        """Start the next prefill if requests wait and fit, else decode, else idle."""
        if self._event is not None and (self.phase == PREFILL or self.stages is not None):
            # A prefill (or staged step) is in flight, started from an on_done callback in
            # _on_decode_done: restarting would drop its batch (or reserve stages twice).
            return
        self._settle()
        batch = self._admit()
        handed = [req for req in batch if req.kv_ready]
        if handed:  # P/D hand-offs: their KV cache is here already
            batch = [req for req in batch if not req.kv_ready]
            for req in handed:
                req.kv_ready = False
                self._join(req)
        if batch:
            if self._event is not None:
                self._event.cancel()
                self._event = None
            # Work in seconds at rate 1, hop included at the current rate (after a
            # rate change the hop scales too: one number for compute + hop).
            self.running.prefill_tokens = sum(req.prefill_tokens for req in batch)
            self.prefilling, rate = batch, self.speed * self.share
            work_s, now = self._prefill_work_s(batch), self.loop.now_s
            if self.stages is not None:  # through the shared stages, in their turn
                self._prefill_left_s = (self.stages.pass_through(now, work_s / rate) - now) * rate
            else:
                self._prefill_left_s = work_s + self.hop_s * rate
            self._set_phase(PREFILL)
            self._schedule_prefill()
            return
        if self.running:
            if self.phase != DECODE:
                self.decode_v0 = self.v
            self._set_phase(DECODE)
            self._schedule_decode()
        else:
            self._set_phase(IDLE)
            if self._event is not None:
                self._event.cancel()
                self._event = None
            if not self.waiting and self.idle_since_s is None:
                self.idle_since_s = self.loop.now_s

    def _prefill_work_s(self, batch: list[SimRequest]) -> float:
        """Compute of one prefill step; a live-scaled request runs only its last layers."""
        if all(r.skip_layers == 0 for r in batch):
            return self.cost.prefill_s(sum(r.prefill_tokens for r in batch))
        n = self.cost.num_layers
        return self.cost.prefill_parts_s([(r.prefill_tokens, n - r.skip_layers) for r in batch])

    def _on_prefill(self) -> None:
        self._event = None
        self.v_time_s = self.loop.now_s
        batch, self.prefilling = self.prefilling, []
        self.running.prefill_tokens = 0
        for req in batch:
            if req.recompute and req.first_token_s >= 0:
                req.generated += 1  # a recomputing prefill samples its next token (vLLM)
            req.recompute = False
            req.skip_layers = 0
            if req.first_token_s < 0:
                req.first_token_s = self.loop.now_s
                req.generated = 1
            if not decodes_where_prefilled(self.role):  # parks for a decode instance
                self.on_prefilled(self, req)
            else:
                self._join(req)
        self._advance()
