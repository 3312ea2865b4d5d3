"""Nodes that heal: a heartbeat finds frozen agents, and dead agents are started again.

What flows: a status call to every live agent every `heartbeat_s` (on a pooled connection
of its own, so a long op on the control connection never looks like a freeze); an agent that
misses `heartbeat_timeout_s` is marked down (`ClusterClient.mark_down`: its event stream
ends with `AgentDown`, so its requests re-run as for a kill). On every `AgentDown` (from the
controller's event pump) a launcher that can (`LocalCluster.restart`) replaces the agent
after `policy.nodes.node_health.restart_delay_s`, and the new agent is wired in: connected, told
its peers (and the peers told of it), every deployment registered, its disk holdings read.
Every decision is `policy/nodes/node_health.py`'s. Owned by control/.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.control.state import Deployment
from surge.policy.multicast.topology import NodeLinks
from surge.policy.nodes.node_health import restart_delay_s, restarts_in_a_row
from surge.runtime.client import ClusterClient
from surge.runtime.protocol import LinkReport, RegisterOp, SetPeersOp, StatusOp

log = logging.getLogger(__name__)


class NodeHealer:
    """The heartbeat and the restarts of one controller's agents."""

    def __init__(
        self,
        client: ClusterClient,
        cluster: Any,
        config: ControllerConfig,
        deployments: dict[str, Deployment],
        pool: ParameterPool,
        links: dict[int, NodeLinks],
        stopping: Callable[[], bool],
    ) -> None:
        self.client, self.cluster, self.config = client, cluster, config
        self.deployments, self.pool, self.links = deployments, pool, links
        self.stopping = stopping
        self.restarts: dict[int, tuple[int, float]] = {}
        """Per node: restarts in a row and when the last one was."""
        self.restarting: set[int] = set()
        self._tasks: set[asyncio.Task] = set()

    @property
    def can_restart(self) -> bool:
        return bool(getattr(self.cluster, "can_restart", False))

    # ---- heartbeat ---------------------------------------------------------------

    async def heartbeat(self) -> None:
        """Forever: every `heartbeat_s`, check every live agent answers in time."""
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            live = [n for n in self.client.addresses if n not in self.client.down]
            await asyncio.gather(*(self._check(n) for n in live))

    async def _check(self, node: int) -> None:
        try:
            async with asyncio.timeout(self.config.heartbeat_timeout_s):
                await self.client.call_bytes(node, StatusOp())
        except TimeoutError:
            if node in self.client.down or self.stopping():
                return
            log.warning(
                "node %d did not answer its heartbeat in %.0f s (frozen?): treating it as down",
                node,
                self.config.heartbeat_timeout_s,
            )
            self.client.mark_down(node)
        except Exception as e:  # gone: its event stream reports it
            log.debug("node %d heartbeat: %s", node, e)

    # ---- restarts ----------------------------------------------------------------

    def node_down(self, node: int) -> None:
        """An agent is gone: replace it (if the launcher can), in the background."""
        if self.stopping() or not self.can_restart or node in self.restarting:
            return
        self.restarting.add(node)
        task = asyncio.get_running_loop().create_task(self._restart(node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, node: int) -> None:
        try:
            while not self.stopping():
                count, last = self.restarts.get(node, (0, None))  # type: ignore[arg-type]
                count = restarts_in_a_row(count, last, time.monotonic())
                delay = restart_delay_s(count, self.config.max_agent_restarts)
                if delay is None:
                    log.error(
                        "node %d stays down: its agent died %d times in a row after restarts",
                        node,
                        count,
                    )
                    return
                await asyncio.sleep(delay)
                self.restarts[node] = (count + 1, time.monotonic())
                try:
                    await self._bring_back(node)
                except Exception as e:
                    log.warning("node %d: restart %d failed: %s", node, count + 1, e)
                    continue
                log.warning("node %d is back: its agent was restarted (%d in a row)",
                            node, count + 1)  # fmt: skip
                return
        finally:
            self.restarting.discard(node)

    async def _bring_back(self, node: int) -> None:
        address = await asyncio.to_thread(self.cluster.restart, node)
        await self.client.reattach(node, address)
        live = [n for n in self.client.addresses if n not in self.client.down]
        hello = await self.client.broadcast(SetPeersOp(peers=dict(self.client.addresses)), live)
        self.links[node] = LinkReport.planned(hello[node].links)
        for dep in list(self.deployments.values()):
            await self.client.call(node, RegisterOp(model=dep.name, manifest=dep.manifest))
        self.pool.load_status(node, await self.client.call(node, StatusOp()))

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
