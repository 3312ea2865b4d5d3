"""The agent's side of P/D disaggregation (BlitzScale §5.2, §6): roles, parking, hand-off.

A local instance has a P/D role (`instance_role`; "decode", the default, runs requests
to the end, as every instance did before P/D). A "prefill" instance parks each request
it prefilled, right after the step that produced its first token: the K/V of every
layer is copied out (`ModelRunner.export_kv`, the KV migration ParaServe consolidation
uses) and the sequence leaves the engine, so prefill capacity frees at once. The first
token goes out as a `TokenGenerated` whose `finish_reason` is `HANDOFF_REASON`; the
controller then takes the parked K/V (`instance_handoff`: typed header + raw bytes) to
the decode instance that policy picks, which adopts it (`instance_adopt`). Mutation is
`instance_role` to "decode": answered at once, it applies from the end of the step under
way (the role is read once as each step ends, so a step never sees half a mutation), as
the simulator's engine reads its role as a prefill step ends (`sim/batching.py`
`_on_prefill`); the weights stay, requests parked before stay parked until taken.
Composed into `AgentInstances` (`runtime/node/instances.py`).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

from surge.errors import SurgeError
from surge.runtime.node.local_instance import LocalInstance, Parked
from surge.runtime.protocol import (
    Ack,
    HandoffReply,
    InstanceHandoffOp,
    InstanceRoleOp,
    KvPart,
    ok_header,
)
from surge.runtime.transport import Connection

if TYPE_CHECKING:
    from surge.engine.llm_engine import TokenEvent


def _no_pace() -> None:
    return None


def step_and_park(
    inst: LocalInstance, pace: Callable[[], None] = _no_pace
) -> tuple[list["TokenEvent"], dict[int, str]]:
    """One engine step (in the worker thread), then `pace` (GPU-time emulation: the step
    lasts what the emulated GPU takes, `instance_loop.paced_step`); if the instance is a
    prefill one as the step ends, park every request whose prefill this step finished.
    Returns the events and seq_id -> req_id of those parked (they left `inst.requests`)."""
    import torch

    engine = inst.engine
    events = engine.step()
    pace()
    # The role as the step ends, read once: a mutation (`instance_role`) that lands while
    # the step runs applies to all of its prefills, never to half of them, as the
    # simulator's engine reads its role when a prefill step ends (`_on_prefill`).
    prefill = inst.role == "prefill"
    parked: dict[int, str] = {}
    for ev in events:
        if ev.seq_id not in inst.fresh:
            continue
        inst.fresh.discard(ev.seq_id)
        if not prefill or ev.finished or ev.seq_id not in inst.requests:
            continue
        seq = engine.seqs[ev.seq_id]
        runner = engine.executor.runner
        kv = runner.export_kv(ev.seq_id, seq.num_cached)
        engine.abort(ev.seq_id)
        rid = inst.requests.pop(ev.seq_id)
        part = KvPart(
            first_layer=runner.first_layer,
            end_layer=runner.end_layer,
            shape=kv.shape,
            digest=runner.manifest.digest,  # its decode instance refuses another version's
        )
        reply = HandoffReply(
            part=part, output_token_ids=tuple(seq.output_token_ids), num_cached=seq.num_cached
        )
        payload = kv.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        inst.parked[rid] = Parked(reply, payload)
        parked[ev.seq_id] = rid
    return events, parked


class AgentPd:
    """`instance_role` and `instance_handoff` over the node's local instances."""

    def __init__(
        self, instances: dict[str, LocalInstance], kv_charge: Callable[[str], float]
    ) -> None:
        self.instances = instances
        self.kv_charge = kv_charge
        """Model -> how its K/V frames are paced (`Connection.send`'s `pace`): under GPU-time
        emulation the K/V's own byte ratio, not the weights' the links are scaled for."""

    def _instance(self, name: str) -> LocalInstance:
        inst = self.instances.get(name)
        if inst is None:
            raise SurgeError(f"no instance {name} here (instance_open first)")
        return inst

    def take_parked(self, inst: LocalInstance, req_ids: set[str]) -> dict[str, tuple[int, ...]]:
        """Take parked requests back (an abort): req_id -> tokens generated so far."""
        taken = req_ids & set(inst.parked)
        return {rid: inst.parked.pop(rid).reply.output_token_ids for rid in taken}

    async def op_instance_role(self, op: InstanceRoleOp, conn: Connection, p: memoryview) -> Ack:
        """Set the instance's role now; the step under way, if any, ends in it
        (`step_and_park` reads it once, as the step ends). Not an inbox change: waiting
        for the step to end held the controller's look over it (BlitzScale §5.2's
        mutation decided at 2.20 s on the emulated §6.1 7B run took effect at 2.511, after
        the instance's 0.43-s prefill step; the monitor's wish for a compensating instance
        was then weighed against the deployment of 2.511: docs/emulation.md)."""
        self._instance(op.instance).role = op.role
        return Ack()

    async def op_instance_handoff(
        self, op: InstanceHandoffOp, conn: Connection, p: memoryview
    ) -> None:
        inst = self._instance(op.instance)
        parked = inst.parked.pop(op.req_id, None)
        if parked is None:
            raise SurgeError(f"request {op.req_id} is not parked on {op.instance}")
        # Paced as the emulated model's K/V (at 1, a 7B hand-off took 17x its time: 0.61 s
        # per leg instead of 37 ms, and P/D decode starved: docs/emulation.md).
        await conn.send(ok_header(parked.reply), parked.payload, self.kv_charge(inst.model))
