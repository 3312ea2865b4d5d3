"""Static launcher: agents that something else started (a StatefulSet, systemd, Slurm, a user).

What flows: a list of agent addresses ("HOST:PORT", or a DNS name that resolves to several
agents, e.g. a Kubernetes headless Service) and the cluster token in; out, the surface the
controller needs of a launcher (`start`, `stop`, `addresses`, `token`, `pids`). `start`
asks every address for its status (over TLS when configured, proving the token like any
connection) until all answer, each reporting the node id it was started with
(`surge node run --node-id N`); ids must be 0..N-1, one per agent. Agents that have not
answered by `timeout_s` are named in one error; a wrong token or certificate fails at once.
An agent lost and started again by its owner (a pod restarted) is joined again
(`restart`, called by the controller's healer). `stop` leaves the agents running: they
belong to whatever started them. Owned by the
runtime; the controller picks it for `surge serve --launcher static`.
"""

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass

from surge.errors import SurgeError
from surge.runtime.handshake import AuthError, connect
from surge.runtime.protocol import StatusOp, StatusReply
from surge.runtime.security.tls import ClusterTls, TlsConfig

log = logging.getLogger(__name__)

RETRY_S = 0.5
"""Pause between two tries of an agent that did not answer yet."""
REJOIN_WAIT_S = 60.0
"""How long one `restart` waits for a lost agent to answer again (the healer retries with
backoff, `policy.nodes.node_health`): a pod's restart fits, a machine's reboot may take several."""


@dataclass(frozen=True)
class StaticClusterConfig:
    """Agents started elsewhere."""

    agents: tuple[str, ...]
    """"HOST:PORT" entries; a host that resolves to several addresses stands for an agent at
    each (a headless Service)."""
    token: str
    """The cluster token the agents were started with."""
    num_nodes: int | None = None
    """How many agents to wait for (None: one per address listed or resolved)."""
    tls: TlsConfig | None = None
    """The controller's TLS files (None: plain TCP)."""
    timeout_s: float = 120.0
    """How long to wait for every agent to answer."""

    def __post_init__(self) -> None:
        if not self.agents:
            raise SurgeError(
                "--launcher static needs --agents HOST:PORT,... (the agents' addresses)"
            )
        for entry in self.agents:
            parse_entry(entry)
        if self.num_nodes is not None and self.num_nodes < 1:
            raise SurgeError(f"a static cluster needs at least one agent (got {self.num_nodes})")
        if not self.timeout_s > 0:
            raise SurgeError(f"the agents' timeout must be > 0 s (got {self.timeout_s})")


def parse_entry(entry: str) -> tuple[str, int]:
    """("HOST", PORT) of one `--agents` entry, or a `SurgeError` saying what a good one is."""
    host, sep, port = entry.strip().rpartition(":")
    host = host.strip("[]")  # [::1]:7070
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SurgeError(f"--agents entries must be HOST:PORT (got {entry!r})")
    return host, int(port)


def resolve(entries: tuple[str, ...]) -> list[tuple[str, int]]:
    """Every agent address the entries name now (a name that does not resolve yet names
    none: its pods may still be starting)."""
    out: list[tuple[str, int]] = []
    for entry in entries:
        host, port = parse_entry(entry)
        try:
            infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror:
            log.info("%s does not resolve yet", host)
            continue
        for addr in sorted({info[4][0] for info in infos}):
            if (addr, port) not in out:
                out.append((addr, port))
    return out


class StaticCluster:
    """Joins running agents; starts and stops none."""

    def __init__(self, config: StaticClusterConfig) -> None:
        self.config = config
        self.token = config.token
        self.addresses: dict[int, tuple[str, int]] = {}
        self.pids: dict[int, int] = {}
        """None: these agents are not this process's children."""
        self.can_restart = True
        """A lost agent that comes back (restarted by what started it) is joined again
        (`control/healing.py` calls `restart`)."""

    def start(self) -> None:
        tls = self.config.tls.load() if self.config.tls is not None else None
        self.addresses = asyncio.run(self._join(tls))
        log.info("joined %d agents: %s", len(self.addresses), self.addresses)

    async def _join(self, tls: ClusterTls | None) -> dict[int, tuple[str, int]]:
        c = self.config
        deadline = time.monotonic() + c.timeout_s
        found: dict[tuple[str, int], int] = {}
        why: dict[tuple[str, int], str] = {}
        while True:
            addrs = resolve(c.agents)
            want = c.num_nodes if c.num_nodes is not None else len(addrs)
            todo = [a for a in addrs if a not in found]
            results = await asyncio.gather(*(self._ask(a, tls) for a in todo))
            for addr, result in zip(todo, results, strict=True):
                if isinstance(result, StatusReply):
                    found[addr] = result.node
                else:
                    why[addr] = result
            if want and len(found) >= want and not [a for a in addrs if a not in found]:
                return self._by_node(found, want)
            if time.monotonic() >= deadline:
                raise SurgeError(self._missing(addrs, found, why, want))
            await asyncio.sleep(RETRY_S)

    async def _ask(self, addr: tuple[str, int], tls: ClusterTls | None) -> StatusReply | str:
        """The agent's status, or why it did not answer (a refusal is raised at once)."""
        try:
            conn = await connect(
                *addr, self.token, "controller", timeout_s=5.0, tls=tls.client if tls else None
            )
        except AuthError as e:
            raise SurgeError(f"agent {addr[0]}:{addr[1]} refused this controller: {e}") from None
        except (OSError, TimeoutError) as e:
            errno = getattr(e, "errno", None)
            return os.strerror(errno) if errno else str(e) or type(e).__name__
        try:
            async with asyncio.timeout(10.0):
                reply, _ = await conn.request(StatusOp().to_json())
            return StatusReply.from_json(reply)
        except (OSError, TimeoutError) as e:
            return str(e) or type(e).__name__
        finally:
            conn.close()

    @staticmethod
    def _missing(addrs, found, why, want: int) -> str:
        waiting = [
            f"{h}:{p} ({why.get((h, p), 'no answer')})" for h, p in addrs if (h, p) not in found
        ]
        if want and len(addrs) < want:
            waiting.append(f"{want - len(addrs)} more that do not resolve yet")
        return (
            f"{len(found)} of {want or '?'} agents answered in time; still missing: "
            f"{', '.join(waiting) or 'none listed'} (are they started with this cluster's "
            "token and TLS files? raise the wait with --agents-timeout)"
        )

    @staticmethod
    def _by_node(found: dict[tuple[str, int], int], want: int) -> dict[int, tuple[str, int]]:
        by_node: dict[int, tuple[str, int]] = {}
        for addr, node in sorted(found.items()):
            if node in by_node:
                a, b = by_node[node], addr
                raise SurgeError(
                    f"agents {a[0]}:{a[1]} and {b[0]}:{b[1]} both say they are node {node}; "
                    "start each with its own --node-id"
                )
            by_node[node] = addr
        if sorted(by_node) != list(range(len(by_node))) or len(by_node) != want:
            raise SurgeError(
                f"the agents' node ids are {sorted(by_node)}; a cluster of {want} needs "
                f"0..{want - 1}, one per agent (surge node run --node-id)"
            )
        return dict(sorted(by_node.items()))

    def restart(self, node: int) -> tuple[str, int]:
        """Wait (at most `REJOIN_WAIT_S`) for agent `node` to answer again at any address
        the entries name now (a restarted pod may have a new one); its address. Starts
        nothing: whatever started the agent restarts it."""
        tls = self.config.tls.load() if self.config.tls is not None else None
        address = asyncio.run(self._find_again(node, tls))
        self.addresses[node] = address
        return address

    async def _find_again(self, node: int, tls: ClusterTls | None) -> tuple[str, int]:
        deadline = time.monotonic() + REJOIN_WAIT_S
        while True:
            for addr in resolve(self.config.agents):
                reply = await self._ask(addr, tls)
                if isinstance(reply, StatusReply) and reply.node == node:
                    log.info("agent %d answers again at %s:%d", node, *addr)
                    return addr
            if time.monotonic() >= deadline:
                raise SurgeError(f"agent {node} did not answer again in {REJOIN_WAIT_S:.0f} s")
            await asyncio.sleep(RETRY_S)

    def stop(self, grace_s: float = 5.0) -> None:
        """Nothing to stop: the agents belong to whatever started them."""
