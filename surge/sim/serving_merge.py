"""FlexPipe's busy merge carried out on one endpoint's head engines (FlexPipe §7, Alg. 1).

In: from `ServingEngine.set_micro_batches(..., batch_retired=True)` (`sim/serving_engine.py`)
each head past the new micro-batch count that holds requests (`BusyMerge.offer`); then, at
each such head's step boundaries, its running and waiting requests and the heads that stay.
Out: each request moved as `policy.flexpipe.merge` decides (`merge_move`, `adoptions`; the
decision is the policy's, this is the simulator carrying it out, as the runtime's
`PipelineEndpoint._batch_retired` and `hand_over_prefilled` do): decoding ones to a staying
head's queue with their K/V, fresh ones re-queued on the head holding the fewest, those
mid-prefill offered again once prefilled. The endpoint's `HeldCount` (`sim/held.py`) is kept
right where each queue changes. Owned by sim/ (one per `ServingEngine`).
"""

from collections.abc import Callable

from surge.policy.flexpipe.merge import MergeMove, SeqPhase, adoptions, merge_move, phase_of
from surge.policy.pipeline_batches import join_micro_batch
from surge.sim.batching import Batcher
from surge.sim.held import HeldCount, without_first_token
from surge.sim.request import SimRequest


class BusyMerge:
    """One endpoint's retiring heads handing their requests to the heads that stay."""

    __slots__ = ("_active", "_after_prefill", "_held", "_remove_waiting")

    def __init__(
        self,
        held: HeldCount,
        active: Callable[[], list[Batcher]],
        remove_waiting: Callable[[set[int]], None],
    ) -> None:
        self._held = held
        self._active = active
        """The heads taking new requests now (the endpoint's first `micro_batches`)."""
        self._remove_waiting = remove_waiting
        """Drops waiting requests by id from every head (`ServingEngine.remove_waiting`)."""
        self._after_prefill: dict[Batcher, set[int]] = {}
        """A retired head's requests a merge left to finish their prefill (by id)."""

    def offer(self, head: Batcher) -> None:
        """A merge retires `head`: at its next step boundary it hands on what it holds."""
        self._after_prefill.pop(head, None)  # this merge offers all it holds
        head.on_boundary = self.retire
        if not head.clock.step_in_flight():
            head.start()

    def retire(self, head: Batcher) -> None:
        """A head past the micro-batch count, between two of its steps, hands what it holds
        to the heads that stay, each request as its phase says
        (`policy.flexpipe.merge.merge_move`; the runtime's `PipelineEndpoint._batch_retired`
        and `hand_over_prefilled`): its decoding requests join their next step with their
        KV (it stays at the shared stages; one whose prefill was in flight at the merge
        decodes by now: its prefill is one step here), its requests not started queue
        there; those with a prefill ahead (preempted, recomputing) stay until it is done,
        the head retiring on at its boundaries till then; those no head has room for stay."""
        active = self._active()
        offered = self._after_prefill.pop(head, None)  # None: the merge's first boundary
        if head in active:  # a split made it active again meanwhile
            return
        v = head.clock.v
        generated = {r.id: round(r.output_tokens - (fv - v)) for fv, _, r in head.running}
        running = head.running.admitted()  # the runtime scheduler's order
        self._held.n -= len(head.running.drain(v))
        for req in running:
            req.generated = generated[req.id]  # at a step boundary: whole tokens
        moves = {r.id: merge_move(phase_of(True, 1)) for r in running}  # decoding
        moves.update({r.id: merge_move(queued_phase(r)) for r in head.waiting})
        # a queued one with its K/V here (adopted earlier) is the runtime's running one
        held = [*running, *(r for r in head.waiting if r.kv_ready)]
        decoding = [r for r in held if offered is None or r.id in offered]
        adopted = adoptions(
            [len(h.running) + sum(r.kv_ready for r in h.waiting) for h in active],
            [len(decoding)],
            active[0].max_batch,
        )
        moved = {decoding[i].id: dst for _, i, dst in adopted}
        joining: list[list[SimRequest]] = [[] for _ in active]
        if len(held) > len(running):
            self._remove_waiting({r.id for r in head.waiting if r.id in moved})
        for req in held:
            req.recompute = False
            if req.id in moved:
                req.kv_ready = True  # decodes on at its new head without a prefill
                joining[moved[req.id]].append(req)
            elif not req.kv_ready:
                head.rejoin(req)  # stays: its finish V from its tokens left
        for h, reqs in zip(active, joining, strict=True):
            h.idle_since_s = None if reqs else h.idle_since_s
            h.waiting.extendleft(reversed(reqs))  # ahead of new work: the runtime adopts now
            self._held.n += len(reqs)
            self._held.prompt_tokens += without_first_token(reqs)
        fresh = [r for r in head.waiting if moves[r.id] is MergeMove.QUEUE_NOW]
        self._remove_waiting({r.id for r in fresh})
        for req in fresh:
            active[join_micro_batch([h.outstanding for h in active])].submit(req, start=False)
        later = {r.id for r in head.waiting if moves[r.id] is MergeMove.AFTER_PREFILL}
        later &= later if offered is None else offered  # the merge's, not later preemptions
        if later:  # offered at its first boundary once prefilled
            self._after_prefill[head] = later
            head.on_boundary = self.retire
        for h in active:
            h.start()


def queued_phase(req: SimRequest) -> SeqPhase:
    """A queued request's phase at its head's step boundary (`policy.flexpipe.merge.
    phase_of`): with its K/V here (`kv_ready`, adopted) it decodes; else it started if it
    generated a token or computed layers (live scaling's `skip_layers`)."""
    if req.kv_ready:
        return phase_of(True, 1)
    started = req.generated > 0 or req.skip_layers > 0
    return phase_of(started, max(2, req.prefill_tokens))
