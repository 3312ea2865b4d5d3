"""One P/D hand-off carried out (BlitzScale §5.2, §6): a prefilled request's K/V to its decode
instance.

In: a `PdServing` (`pd_handoff.py`, which chose the target, reserved its room and runs
these as tasks, one per (source, target) pair; `HandoffHost` is what they use of it), the
request, and where its K/V is: parked on its prefill instance (`send_parked`: taken off that
agent with `instance_handoff`, typed header + raw bytes) or held here (`send_held`: a live
batch's, BlitzScale §4, `InHand`).
Out: the decode instance adopts it and decodes on, token-exact
(`runtime/migration/consolidation.adopt`, the KV migration ParaServe consolidation uses),
or, when an agent dies, the request goes back to the head of the queue with its tokens and
is prefilled again (`Server.requeue`): it is on exactly one of {an endpoint, the queue, a
hand-off in flight} at each await. Owned by the runtime; it decides nothing.
"""

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.consolidation import adopt
from surge.runtime.migration.failures import failure_level
from surge.runtime.protocol import InstanceHandoffOp, KvPart
from surge.runtime.request import ServeRequest

if TYPE_CHECKING:
    from surge.runtime.server import Server

log = logging.getLogger(__name__)

HERE = ""
"""The source name of K/V the controller holds (live-prefilled requests, `PdServing.hold`)."""


class HandoffHost(Protocol):
    """What a hand-off needs of the P/D side that runs it (`pd_handoff.PdServing`), named here
    so this module does not import the one that imports it."""

    server: "Server"
    kv_pace: float
    num_handoffs: int
    num_handoff_retries: int

    def booked(self, pair: tuple[str, str]) -> None: ...

    def received(self, source_node: int | None, target: LocalEndpoint, nbytes: int) -> None: ...


@dataclass(frozen=True)
class InHand:
    """A request prefilled by live scaling whose K/V the controller holds."""

    req: ServeRequest
    parts: list[KvPart]
    payload: bytes
    num_cached: int
    old: LocalEndpoint


async def send_held(pd: HandoffHost, held: InHand, target: LocalEndpoint) -> None:
    """Give `held`'s K/V to `target` (whose room `PdServing._start` reserved)."""
    pd.booked((HERE, target.name))  # `adopt` books it on `target` now
    pd.received(None, target, len(held.payload))
    try:
        await adopt(
            pd.server,
            target,
            held.req,
            num_cached=held.num_cached,
            parts=held.parts,
            payload=held.payload,
            pace=pd.kv_pace,
        )
        pd.num_handoffs += 1
    except Exception as e:  # its agent died, has no room, or refused another version's
        # K/V: prefill it again
        log.log(failure_level(e), "%s could not adopt %s (%s)", target.name, held.req.req_id, e)
        pd.num_handoff_retries += 1
        await pd.server.requeue([held.req])


async def send_parked(
    pd: HandoffHost, src: LocalEndpoint, req: ServeRequest, target: LocalEndpoint
) -> None:
    """Move a request parked on prefill instance `src` (taken off it already) to `target`
    (whose room `PdServing._start` reserved: the request is on neither while its K/V is in
    flight)."""
    server = pd.server
    try:
        reply, body = await server.client.call_bytes(
            src.node, InstanceHandoffOp(instance=src.name, req_id=req.req_id)
        )
    except Exception as e:  # the prefill agent died, or it lost the request
        log.info("hand-off of %s from %s failed (%s); prefill again", req.req_id, src.name, e)
        pd.num_handoff_retries += 1
        await server.requeue([req])
        return
    missing = list(reply.output_token_ids[len(req.output_token_ids) :])
    for tok in missing:  # tokens the agent made that had not arrived here yet
        req.add_token(tok, False, None)
    payload = bytes(body)
    pd.booked((src.name, target.name))  # `adopt` books it on `target` now
    pd.received(src.node, target, len(payload))
    for ep in dict.fromkeys(t for t in (target, src) if not t.failed):
        try:
            await adopt(
                server,
                ep,
                req,
                num_cached=reply.num_cached,
                parts=[reply.part],
                payload=payload,
                pace=pd.kv_pace,
            )
        except Exception as e:  # the decode agent died, it has no room after all, or it
            # refused another version's K/V (the source, of the K/V's version, decodes it)
            log.log(failure_level(e), "%s could not adopt %s (%s)", ep.name, req.req_id, e)
            if not server.unplaced(req):
                return  # its agent died mid-call and the retirement requeued it
            continue
        pd.num_handoffs += 1
        return
    pd.num_handoff_retries += 1
    await server.requeue([req])
