"""A deployment's model on the live agents: its version registered, another version of the
name dropped first, the model dropped from one node.

What flows: out, a `RegisterOp` (the store's version, `Manifest.digest`) to every live agent,
a `StatusOp` broadcast to find the nodes holding another version (`policy.versions`), and
a `DropModelOp` per node (running loads aborted, instances and stages closed, every copy
evicted); in, the agents' replies, a refusal turned into a `Conflict` with its reason and
fix. Called by `control/deployments.py` (create, restore, delete, teardown). Owned by
control/.
"""

import asyncio
import logging

from surge.errors import Conflict
from surge.model.manifest import Manifest
from surge.policy.versions import other_versions, short
from surge.runtime.client import ClusterClient
from surge.runtime.protocol import DropModelOp, RegisterOp, StatusOp
from surge.runtime.transport import RemoteError

log = logging.getLogger(__name__)

DROP_TIMEOUT_S = 30.0
"""Bound on one node's `drop_model` (it aborts the model's ops there: well under a second)."""


async def drop_other_versions(
    client: ClusterClient, name: str, manifest: Manifest, live: list[int]
) -> None:
    """Drop the model on every node that holds another version of it (copies, and the
    instances and stages an older controller or a failed drop left there: the name's
    deployment is this one, `policy.versions.other_versions`), one WARNING each. A
    register alone would replace a version nothing runs on, and refuse the rest."""
    statuses = await client.broadcast(StatusOp(), live)
    held = {n: s.models[name].digest for n, s in statuses.items() if name in s.models}
    for node in other_versions(held, manifest.digest):
        running = [r.name for r in statuses[node].running if r.model == name]
        log.warning(
            "%s: node %d holds another version (%s, deploying %s; running: %s): dropped",
            name, node, short(held[node]), short(manifest.digest), running or "nothing",
        )  # fmt: skip
        await drop_model(client, name, node)


async def register_version(
    client: ClusterClient, name: str, manifest: Manifest, live: list[int]
) -> None:
    """Register the model's version on every live node; a node that refuses (another
    version runs there) makes it a `Conflict` with the agent's reason and fix."""
    try:
        await client.broadcast(RegisterOp(model=name, manifest=manifest), live)
    except RemoteError as e:
        raise Conflict(
            f"deployment {name!r} cannot be registered: {e} (its drop there failed: "
            "restart that node's agent, or wait for it, then deploy again)"
        ) from None


async def drop_model(client: ClusterClient, name: str, node: int) -> None:
    """Forget the model on one node (`DropModelOp`); the model goes anyway."""
    try:
        async with asyncio.timeout(DROP_TIMEOUT_S):
            reply, _ = await client.call_bytes(node, DropModelOp(model=name))
    except Exception as e:  # a node gone or stuck: its copies go with it
        log.warning("%s: not dropped on node %d: %s", name, node, str(e) or repr(e))
        return
    if reply.aborted_ops:
        log.info("%s: %d running ops aborted on node %d", name, reply.aborted_ops, node)
