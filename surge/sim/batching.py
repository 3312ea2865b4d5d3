"""Continuous batching with O(1) events per request: one head engine's admission and prefill.

In: requests its endpoint's `ServingEngine` (`sim/serving_engine.py`: one head per
micro-batch) submits, a `CostModel`, limits, a speed factor, a per-step hop cost or the
pipeline's shared stages. Out: callbacks when a request gets its first token, is done, or
(prefill role) leaves for a decode instance. It knows nothing of GPUs, pools or loading.

Cost model, event-light: at a step boundary (`sim/step_admission.py`) a prefill step admits
waiting requests (batch, KV and `max_prefill_tokens` limits; a BlitzScale live batch's last
layers first, a step of their own: `policy.blitzscale.live_step.next_step`) and takes
cost.prefill_s(tokens)/speed + hop; decode waits meanwhile (prefill-first, as vLLM). Its
steps' timing is the `DecodeClock` it holds (`sim/decode_clock.py`: a decode clock V, only
the next finish scheduled, O(1) events per request); this class decides what each step runs
and holds the requests. KV as vLLM holds it (`sim/decode_batch.py`): a
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

from surge.policy.blitzscale.handoff import decodes_where_prefilled
from surge.policy.blitzscale.live_step import OWN, next_step
from surge.sim.decode_batch import DecodeBatch
from surge.sim.decode_clock import DECODE, IDLE, PREFILL, DecodeClock
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.held import HeldCount, without_first_token
from surge.sim.request import SimRequest
from surge.sim.stage_line import StageLine
from surge.sim.step_admission import admissible, decode_step_left

STAGED_STEP_SHORTCUT = True
"""A staged step's end with nothing to admit schedules the next step at once (off: every
check of `Batcher._advance` runs, the plain path tests/sim/test_sim_speed.py compares)."""
ADMISSIONS_KEPT = 4096
"""Admission times an engine keeps (BlitzScale's drain rate looks at the last 2 s)."""


class Batcher:
    """One head engine's continuous batching (`ServingEngine` runs one per micro-batch)."""

    __slots__ = (
        "admitted_s",
        "clock",
        "has_live",
        "held",
        "idle_since_s",
        "kv_capacity_tokens",
        "loop",
        "max_batch",
        "max_prefill_tokens",
        "on_boundary",
        "on_busy",
        "on_done",
        "on_prefilled",
        "prefilling",
        "role",
        "running",
        "tokens_done",
        "waiting",
    )

    def __init__(
        self,
        iid: int,
        loop: EventLoop,
        spec: EngineSpec,
        on_done: Callable[[Self, SimRequest], None],
        on_prefilled: Callable[[Self, SimRequest], None],
        held: HeldCount | None = None,
    ) -> None:
        self.loop = loop
        self.held = HeldCount() if held is None else held
        """Its endpoint's count of held requests (`sim/held.py`), kept at each change here."""
        self.role = spec.role
        self.max_batch = spec.max_batch
        self.kv_capacity_tokens = spec.kv_capacity_tokens
        self.max_prefill_tokens = spec.max_prefill_tokens
        self.on_done = on_done
        self.on_prefilled = on_prefilled
        self.waiting: deque[SimRequest] = deque()
        self.has_live = False
        """A live batch's request reached `waiting` and no step took every one yet (most
        engines never see one: `_admit` looks for them only then)."""
        self.running = DecodeBatch(spec.kv_capacity_tokens)
        """The requests decoding and the KV tokens held (by prompt, as vLLM admits)."""
        self.prefilling: list[SimRequest] = []
        self.tokens_done = 0
        self.clock = DecodeClock(
            iid,
            loop,
            spec,
            self.running,
            self.waiting,
            self._finish,
            self._advance,
            self._on_prefill,
            self.held,
        )
        """When its steps end (it shares `running` and `waiting`)."""
        self.admitted_s: deque[float] = deque(maxlen=ADMISSIONS_KEPT)
        """When the latest requests left `waiting` (BlitzScale's SLO check's drain rate)."""
        self.idle_since_s: float | None = loop.now_s
        self.on_busy: Callable[[Self], None] | None = None
        """Called when the engine turns busy or idle (compute sharing)."""
        self.on_boundary: Callable[[Self], None] | None = None
        """Called once, at its next step boundary (a FlexPipe merge retires it there)."""

    # --- load signals -------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Requests waiting, prefilling or decoding here."""
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    @property
    def kv_tokens(self) -> float:
        """KV-cache tokens its requests hold now."""
        c = self.clock
        v = c.v
        if c.phase == DECODE and c.step_s > 0:
            v += (self.loop.now_s - c.v_time_s) / c.step_s
        return self.running.held_tokens(v)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens it generates per second now (every running request, one per step)."""
        c = self.clock
        if c.phase != DECODE or c.step_s <= 0:
            return 0.0
        return len(self.running) / c.step_s

    # --- entry points -------------------------------------------------------------
    def submit(self, req: SimRequest, start: bool = True) -> None:
        """Take a request (from the router, or a decode hand-off with its KV cache);
        `start` False: the caller hands it more at this instant and then calls `start`."""
        self.idle_since_s = None
        self.waiting.append(req)
        self.has_live = self.has_live or req.live_batch >= 0
        self.held.n += 1
        if req.first_token_s < 0:
            self.held.prompt_tokens += req.input_tokens
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
        c = self.clock
        if c.phase == PREFILL or c.stepping:
            return
        if c.stages is not None and c.phase == DECODE:
            return  # every staged step's end is an event: it admits the waiting work
        left = 0.0
        if c.phase == DECODE and self.waiting:
            c.settle()
            left = decode_step_left(c.v, c.decode_v0)
        if left <= 0:
            self._advance()
            return
        c.end_step_at(c.v_time_s + left * c.step_s)

    def resume(self, req: SimRequest) -> None:
        """Decode here a request this engine prefilled and handed on (`on_prefilled`):
        P/D with no decode instance, or the hand-off target is this engine itself."""
        self.idle_since_s = None
        self.clock.settle()
        req.handoff_s = req.kv_arrived_s = req.decode_joined_s = self.loop.now_s  # in place
        self._join(req)
        if self.clock.phase != PREFILL:  # a prefill in flight advances when it ends
            self._advance()

    def rejoin(self, req: SimRequest) -> None:
        """A request drained from this engine between two steps decodes on here, its KV
        kept (a FlexPipe merge found no other head with room for it)."""
        self._join(req)

    @property
    def busy(self) -> bool:
        """Whether a prefill or decode step is under way."""
        return self.clock.phase != IDLE

    def set_speed(self, speed: float) -> None:
        """Change relative speed (live loading finished, pipeline hop changed)."""
        c = self.clock
        self._set_rate(speed, c.share, c.hop_s)

    def set_hop(self, hop_s: float) -> None:
        """Change the per-step activation hop (a pipeline's stages changed)."""
        c = self.clock
        self._set_rate(c.speed, c.share, hop_s)

    def use_stages(self, stages: StageLine) -> None:
        """Step through `stages` (shared with other micro-batches; they charge the hops)
        from its next step on: a decode phase under way ends when its step does."""
        self.set_hop(0.0)
        self.clock.use_stages(stages)

    def set_share(self, share: float) -> None:
        """Change the fraction of a compute unit this engine gets (0 < share <= 1)."""
        c = self.clock
        self._set_rate(c.speed, share, c.hop_s)

    def _set_rate(self, speed: float, share: float, hop_s: float) -> None:
        if self.clock.set_rate(speed, share, hop_s) and self.waiting:
            self.start()  # it waits for the step's end: when that ends at the new rate

    def _set_phase(self, phase: int) -> None:
        c = self.clock
        was = c.phase != IDLE
        c.phase = phase
        if self.on_busy is not None and was != (phase != IDLE):
            self.on_busy(self)

    def drain(self) -> list[SimRequest]:
        """Stop serving: return every unfinished request, marked for KV recomputation."""
        c = self.clock
        c.settle()
        c.cancel()
        out = [*self.prefilling, *self.running.drain(c.v), *self.waiting]
        self.held.prompt_tokens -= without_first_token(self.prefilling) + without_first_token(
            self.waiting
        )
        self.waiting.clear()
        self.prefilling.clear()
        self.held.n -= len(out)
        self._set_phase(IDLE)
        return out

    # --- internals ----------------------------------------------------------------
    def _admit(self) -> list[SimRequest]:
        """What the next step takes: a live batch's requests alone when one waits
        (`_live_step`), else the waiting requests that fit now
        (`step_admission.admissible`)."""
        if self.has_live:
            batch = self._live_step()
            if batch:
                return batch
        n = admissible(
            self.waiting,
            len(self.running),
            self.kv_tokens,
            self.max_batch,
            self.kv_capacity_tokens,
            self.max_prefill_tokens,
        )
        return self._took([self.waiting.popleft() for _ in range(n)])

    def _took(self, batch: list[SimRequest]) -> list[SimRequest]:
        """`batch` left `waiting` for the next step."""
        self.held.n -= len(batch)  # out of the queue; counted again where each goes next
        self.held.prompt_tokens -= without_first_token(batch)
        self.admitted_s.extend([self.loop.now_s] * len(batch))
        return batch

    def _live_step(self) -> list[SimRequest]:
        """The first-arrived live batch's requests, taken off `waiting`, when one waits:
        its last layers are a step of their own, before this engine's own requests
        (`policy.blitzscale.live_step.next_step`, BlitzScale §5.2 Eq. 1), whole, as the
        runtime's one stage step of the batch (no admission limit splits it); else none
        (and no live batch waits any more)."""
        keys = [r.live_batch if r.live_batch >= 0 else OWN for r in self.waiting]
        chosen = next_step(keys)
        if not chosen or keys[chosen[0]] is OWN:
            self.has_live = False
            return []
        taken = set(chosen)
        batch = [self.waiting[i] for i in chosen]
        kept = [r for i, r in enumerate(self.waiting) if i not in taken]
        self.waiting.clear()
        self.waiting.extend(kept)
        return self._took(batch)

    def _advance(self) -> None:
        """Start the next prefill if requests wait and fit, else decode, else idle."""
        c = self.clock
        if (  # most steps of a pipeline (one event each): the next decode step at once
            STAGED_STEP_SHORTCUT
            and c.stages is not None
            and c.event is None
            and c.phase == DECODE
            and c.v_time_s == self.loop.now_s
            and not self.waiting
            and self.on_boundary is None
            and self.running
        ):  # what the lines below do then (no step in flight, settled, nothing to admit)
            c.schedule_decode()
            return
        if c.step_in_flight():
            # Started from an on_done callback in the clock's decode step end.
            return
        c.settle()
        if self.on_boundary is not None:  # between two steps, as the runtime's step gate
            hook, self.on_boundary = self.on_boundary, None
            hook(self)
        batch = self._admit() if self.waiting else []  # most staged steps: nothing waits
        handed = [req for req in batch if req.kv_ready] if batch else batch
        if handed:  # P/D hand-offs: their KV cache is here already
            batch = [req for req in batch if not req.kv_ready]
            for req in handed:
                req.kv_ready = False
                req.decode_joined_s = self.loop.now_s  # its first decode step here starts
                self._join(req)
        if batch:
            self.running.prefill_tokens = sum(req.prefill_tokens for req in batch)
            self.prefilling = batch
            self.held.n += len(batch)
            self.held.prompt_tokens += without_first_token(batch)
            c.prefill(batch)
            self._set_phase(PREFILL)
            c.schedule_prefill()
            return
        if self.running:
            if c.phase != DECODE:
                c.decode_v0 = c.v
                self._set_phase(DECODE)
            c.schedule_decode()
        else:
            self._set_phase(IDLE)
            c.cancel()
            if not self.waiting and self.idle_since_s is None:
                self.idle_since_s = self.loop.now_s

    def _join(self, req: SimRequest) -> None:
        req.decode_instance = self.clock.id
        left = req.output_tokens - req.generated
        if left <= 0:
            self._finish(req)
            return
        self.running.join(req, self.clock.v + left)
        self.held.n += 1

    def _finish(self, req: SimRequest) -> None:
        req.done_s = max(self.loop.now_s, req.first_token_s)
        req.generated = req.output_tokens
        self.tokens_done += req.output_tokens
        self.on_done(self, req)

    def _on_prefill(self) -> None:
        """The prefill step ended (the clock's event): its requests have their first token."""
        batch, self.prefilling = self.prefilling, []
        self.held.n -= len(batch)  # each counted again if it joins the decode batch
        self.held.prompt_tokens -= without_first_token(batch)  # before their first tokens
        self.running.prefill_tokens = 0
        for req in batch:
            if req.recompute and req.first_token_s >= 0:
                req.generated += 1  # a recomputing prefill samples its next token (vLLM)
            req.recompute = False
            req.skip_layers = 0
            req.live_batch = -1
            if req.first_token_s < 0:
                req.first_token_s = self.loop.now_s
                req.generated = 1
            if not decodes_where_prefilled(self.role):  # parks for a decode instance
                self.on_prefilled(self, req)
            else:
                self._join(req)
        self._advance()
