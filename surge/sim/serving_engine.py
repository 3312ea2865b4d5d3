"""An endpoint's serving engine: one head engine per micro-batch over the pipeline's stages.

In: requests the router (or a P/D hand-off, a mode switch, live scaling) submits to an
endpoint; the endpoint's shape (`set_micro_batches`: micro-batches in flight and stages,
`set_hop`), speed and compute share. Out: each request to one head engine (`Batcher`,
`sim/batching.py`) and the endpoint's load signals summed over them (outstanding, KV,
tokens/s, busy, idle since). A whole instance has one head and no shared stages: its steps
are the `Batcher`'s, O(1) events per request. A pipeline of η micro-batches has η heads, as
the runtime's `PipelineEndpoint` (`runtime/pipeline_endpoint.py`: one head engine per micro-batch
over the shared stages): a request joins the micro-batch holding the fewest
(`policy.pipeline_batches.join_micro_batch`, the runtime's own rule), each head admits at
its own step boundaries, and every head's steps cross one `StageLine`
(`sim/stage_line.py`), each stage computing one step at a time. So a burst's micro-batches
follow each other through the stages one stage-time apart, and a micro-batch's decode step
waits behind another's prefill at every stage. Before, a pipeline was one batcher whose
decode paused only while a prefill held the first stage (FlexPipe §9 static-2 at CV 2:
TTFT p50 0.56x the emulated runtime's, docs/emulation.md). `Instance` (`sim/instance.py`)
is the endpoint built on it. At a FlexPipe merge (`set_micro_batches(...,
batch_retired=True)`) the heads past the new count hand their requests to those that stay
at their next step boundary (`policy.flexpipe.merge`, as the runtime's; carried out by
`BusyMerge`, `sim/serving_merge.py`). Owned by sim/.
"""

from collections.abc import Callable
from itertools import chain, islice
from typing import Self

from surge.policy.pipeline_batches import join_micro_batch
from surge.sim.batching import Batcher
from surge.sim.decode_clock import DECODE
from surge.sim.engine_spec import EngineSpec
from surge.sim.events import EventLoop
from surge.sim.held import HeldCount, without_first_token
from surge.sim.request import SimRequest
from surge.sim.serving_merge import BusyMerge
from surge.sim.stage_line import StageLine


class ServingEngine:
    """An endpoint's head engines (one per micro-batch) and the stages they share."""

    __slots__ = (
        "_busy",
        "_held",
        "_hop_s",
        "_kv_capacity_tokens",
        "_max_batch",
        "_merge",
        "_num_stages",
        "_on_done",
        "_on_prefilled",
        "_spec",
        "heads",
        "id",
        "loop",
        "micro_batches",
        "on_busy",
        "stages",
    )

    def __init__(
        self,
        iid: int,
        loop: EventLoop,
        spec: EngineSpec,
        on_done: Callable[[Self, SimRequest], None],
        on_prefilled: Callable[[Self, SimRequest], None],
    ) -> None:
        self.id = iid
        self.loop = loop
        self._spec = spec
        self._max_batch = spec.max_batch
        self._kv_capacity_tokens = spec.kv_capacity_tokens
        self._hop_s = spec.hop_s
        self._num_stages = 1
        self._busy = False
        self.micro_batches = 1
        """Head engines taking new requests (micro-batches in flight)."""
        self.stages: StageLine | None = None
        """The stages every head's steps cross (None: one head, steps through every layer)."""
        self.on_busy: Callable[[Self], None] | None = None
        """Called when the endpoint turns busy or idle (compute sharing)."""
        self.heads: list[Batcher] = []
        self._held = HeldCount()
        """Requests its heads hold, kept as they change (`sim/held.py`)."""
        self._merge = BusyMerge(
            self._held, lambda: self.heads[: self.micro_batches], self.remove_waiting
        )
        """FlexPipe's busy merge on its retiring heads (`sim/serving_merge.py`)."""
        # a head's callbacks name the endpoint, not the head
        self._on_done = lambda _head, req: on_done(self, req)
        self._on_prefilled = lambda _head, req: on_prefilled(self, req)
        self._add_head()

    # --- shape ----------------------------------------------------------------------
    def _add_head(self) -> None:
        head = Batcher(
            self.id, self.loop, self._spec, self._on_done, self._on_prefilled, self._held
        )
        head.on_busy = self._head_busy
        if self.heads:  # as fast as its siblings now
            first = self.heads[0].clock
            head.clock.speed, head.clock.share = first.speed, first.share
        self.heads.append(head)

    def set_micro_batches(
        self, count: int, num_stages: int | None = None, batch_retired: bool = False
    ) -> None:
        """Take new requests on `count` head engines from now on, over `num_stages` stages
        (default `count`: FlexPipe §7 Eq. 12 keeps one micro-batch per stage). Heads past
        `count` take nothing new and finish what they hold, unless `batch_retired`
        (FlexPipe's merge, `FlexPipeSettings.batch_merged_sequences`): then at its next
        step boundary each hands its sequences to the heads that stay (`BusyMerge.retire`,
        `sim/serving_merge.py`)."""
        self.micro_batches = max(1, count)
        self._num_stages = max(1, num_stages or count)
        while len(self.heads) < self.micro_batches:
            self._add_head()
        self._apply_shape()
        for head in self.heads[self.micro_batches :]:
            if batch_retired and head.outstanding:
                self._merge.offer(head)

    def set_hop(self, hop_s: float) -> None:
        """The activation hops of one step through every stage (seconds, all together)."""
        self._hop_s = hop_s
        self._apply_shape()

    def _apply_shape(self) -> None:
        """Heads' limits and hops from the endpoint's. Once pipelined (several heads) its
        heads cross shared stages for good: a head past `micro_batches` may still run."""
        count = self.micro_batches
        for head in self.heads:
            head.max_batch = -(-self._max_batch // count)
            head.kv_capacity_tokens = self._kv_capacity_tokens // count
            head.running.capacity_tokens = head.kv_capacity_tokens
        if len(self.heads) == 1:
            if self.heads[0].clock.hop_s != self._hop_s:
                self.heads[0].set_hop(self._hop_s)
            return
        n = self._num_stages
        hop_each_s = self._hop_s / (n - 1) if n > 1 else 0.0
        if self.stages is None:
            self.stages = StageLine(n, hop_each_s, self.loop.now_s)
        elif n != self.stages.num_stages:
            self.stages.reshape(n, self.loop.now_s)
        self.stages.hop_s = hop_each_s
        for head in self.heads:
            if head.clock.stages is None:  # a split: the first head may be decoding
                head.use_stages(self.stages)

    @property
    def max_batch(self) -> int:
        """Requests it runs at once, every head together (the router's capacity)."""
        return self._max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:
        self._max_batch = value
        self._apply_shape()

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens its KV cache holds, every head's together."""
        return self._kv_capacity_tokens

    @kv_capacity_tokens.setter
    def kv_capacity_tokens(self, value: int) -> None:
        self._kv_capacity_tokens = value
        self._apply_shape()

    @property
    def cost(self):
        return self.heads[0].clock.cost

    @property
    def role(self) -> str:
        return self.heads[0].role

    @role.setter
    def role(self, value: str) -> None:
        for head in self.heads:
            head.role = value

    @property
    def speed(self) -> float:
        return self.heads[0].clock.speed

    @property
    def share(self) -> float:
        """The fraction of a compute unit it gets now (host compute sharing)."""
        return self.heads[0].clock.share

    # --- load signals -----------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Requests waiting, prefilling or decoding here."""
        # Read for every endpoint at each routing decision and autoscaler look: counted
        # as the heads change (`sim/held.py`), not summed over them at each read.
        return self._held.n

    @property
    def pending_prompt_tokens(self) -> int:
        """Prompt tokens of its waiting and prefilling requests without a first token (the
        load monitor's prefill load), counted as the heads change (`sim/held.py`)."""
        return self._held.prompt_tokens

    @property
    def busy(self) -> bool:
        """Whether any head's step is under way."""
        return any(h.busy for h in self.heads)

    @property
    def decode_tokens_per_s(self) -> float:
        heads = self.heads  # one head: its own (0 + x is x, the sum's float)
        if len(heads) == 1:
            return heads[0].decode_tokens_per_s
        return sum([h.decode_tokens_per_s for h in heads])  # a list: read at every look

    @property
    def kv_tokens(self) -> float:
        """KV-cache tokens its requests hold now, every head's."""
        heads = self.heads
        return heads[0].kv_tokens if len(heads) == 1 else sum([h.kv_tokens for h in heads])

    def monitor_reads(self) -> tuple[float | None, float, float]:
        """`idle_since_s`, `decode_tokens_per_s` and `kv_tokens` in one pass over the heads:
        an autoscaler look with the load monitor reads all three of every instance
        (`sim/scaling.py` `pool_load`). The properties' own values, each head's read as its
        `Batcher` reads it and summed over the heads in order, as they sum."""
        now, since, rates, kvs = self.loop.now_s, [], [], []
        for h in self.heads:
            since.append(h.idle_since_s)
            c, running = h.clock, h.running
            if c.phase == DECODE and c.step_s > 0:
                rates.append(len(running) / c.step_s)
                kvs.append(running.held_tokens(c.v + (now - c.v_time_s) / c.step_s))
            else:
                rates.append(0.0)
                kvs.append(running.held_tokens(c.v))
        if len(kvs) == 1:  # one head: its own (0 + x is x, the sum's float)
            return since[0], rates[0], kvs[0]
        idle_s = None if None in since else max(since)  # type: ignore[type-var]
        return idle_s, sum(rates), sum(kvs)

    @property
    def tokens_done(self) -> int:
        return sum(h.tokens_done for h in self.heads)

    @property
    def waiting(self):
        """Requests waiting for a step (one head's queue, or every head's in order)."""
        if len(self.heads) == 1:
            return self.heads[0].waiting
        return list(chain.from_iterable(h.waiting for h in self.heads))

    @property
    def running(self) -> list[tuple[float, int, SimRequest]]:
        """(finish V, id, request) of every decoding request, head by head."""
        return list(chain.from_iterable(h.running for h in self.heads))

    @property
    def prefilling(self) -> list[SimRequest]:
        return list(chain.from_iterable(h.prefilling for h in self.heads))

    @property
    def admitted_s(self):
        """When the latest requests left a queue for a step (every head's, in time order)."""
        if len(self.heads) == 1:
            return self.heads[0].admitted_s
        return sorted(chain.from_iterable(h.admitted_s for h in self.heads))

    @property
    def idle_since_s(self) -> float | None:
        """Since when it holds no request (None: it holds some)."""
        if len(self.heads) == 1:
            return self.heads[0].idle_since_s
        since = [h.idle_since_s for h in self.heads]
        return None if None in since else max(since)  # type: ignore[type-var]

    @idle_since_s.setter
    def idle_since_s(self, value: float | None) -> None:
        for head in self.heads:
            head.idle_since_s = value

    def micro_batch_of(self, req_id: int) -> int | None:
        """The head (micro-batch) holding request `req_id`, if any."""
        for i, h in enumerate(self.heads):
            held = chain(h.waiting, h.prefilling, (r for _, _, r in h.running))
            if any(r.id == req_id for r in held):
                return i
        return None

    # --- entry points -----------------------------------------------------------------
    def _pick(self) -> Batcher:
        if len(self.heads) == 1:
            return self.heads[0]
        active = self.heads[: self.micro_batches]
        return active[join_micro_batch([h.outstanding for h in active])]

    def submit(self, req: SimRequest, start: bool = True) -> None:
        """Take a request on the micro-batch holding the fewest; `start` False: the caller
        hands it more at this instant and then calls `start`."""
        self._pick().submit(req, start)

    def submit_many(self, reqs: list[SimRequest]) -> None:
        """Take several requests at once (admitted together at each head's next step)."""
        for req in reqs:
            self.submit(req, start=False)
        if reqs:
            self.start()

    def start(self) -> None:
        """Each head starts its waiting work at its next step boundary."""
        for head in self.heads:
            head.start()

    def resume(self, req: SimRequest) -> None:
        """Decode here a request this endpoint prefilled and handed on (P/D)."""
        self._pick().resume(req)

    def take_waiting(self, count: int) -> list[SimRequest]:
        """Up to `count` waiting requests that have not started anywhere, head by head,
        oldest first (BlitzScale's live scaling takes them elsewhere)."""
        fresh = (r for h in self.heads for r in h.waiting if r.skip_layers == r.generated == 0)
        taken = list(islice(fresh, count))
        self.remove_waiting({r.id for r in taken})
        return taken

    def remove_waiting(self, ids: set[int]) -> None:
        """Drop the waiting requests whose id is in `ids` (another instance runs them)."""
        for head in self.heads:
            if any(r.id in ids for r in head.waiting):
                kept = [r for r in head.waiting if r.id not in ids]
                gone = [r for r in head.waiting if r.id in ids]
                self._held.n -= len(gone)
                self._held.prompt_tokens -= without_first_token(gone)
                head.waiting.clear()
                head.waiting.extend(kept)
                if head.outstanding == 0 and head.idle_since_s is None:
                    head.idle_since_s = self.loop.now_s

    def drain(self) -> list[SimRequest]:
        """Stop serving: every unfinished request, marked for KV recomputation."""
        out = [req for head in self.heads for req in head.drain()]
        if self.stages is not None:
            self.stages.clear(self.loop.now_s)
        return out

    def set_speed(self, speed: float) -> None:
        """Change relative speed (live loading finished)."""
        for head in self.heads:
            head.set_speed(speed)

    def set_share(self, share: float) -> None:
        """Change the fraction of a compute unit it gets (0 < share <= 1)."""
        for head in self.heads:
            head.set_share(share)

    def _head_busy(self, _head: Batcher) -> None:
        busy = self.busy
        if busy != self._busy:
            self._busy = busy
            if self.on_busy is not None:
                self.on_busy(self)
