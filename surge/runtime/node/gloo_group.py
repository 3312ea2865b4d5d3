"""One `torch.distributed` gloo process group of a scale-out, made and destroyed by hand.

What flows: the root (rank 0) binds a listening socket on its agent's own address, never
0.0.0.0, and hands it to torch's `TCPStore` (`master_listen_fd`); the other members connect
to it there. Each member then builds a `ProcessGroupGloo` whose gloo device binds its own
agent's address too, so the group's bytes cross the same (kernel-shaped) links as the
agent's own transport. No default process group and no global state: a group lives exactly
as long as its `GlooGroup`, and `close` takes it down (its threads, its connections, the
store's listener). Everything here blocks: the agent calls it from worker threads
(`runtime/node/collective.py`). The store speaks torch's own rendezvous protocol and the
collective moves raw tensor bytes; nothing of ours is pickled.
"""

import logging
import socket
import warnings
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)


def bind_rendezvous(host: str) -> socket.socket:
    """The root's listening socket for the group's store, on `host` (its agent's address)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class GlooGroup:
    """A member's view of one gloo group: its store and its process group."""

    def __init__(self, store: Any, host: str) -> None:
        self.store = store
        self.host = host
        self.pg: Any = None
        self.tensors: list[Any] = []

    @classmethod
    def root_store(cls, listener: socket.socket, world_size: int, init_timeout_s: float):
        """Rank 0's store, serving on `listener` (its file descriptor is given to torch,
        which closes it with the store)."""
        from torch.distributed import TCPStore

        host, port = listener.getsockname()[:2]
        store = TCPStore(
            host,
            port,
            world_size,
            True,
            timedelta(seconds=init_timeout_s),
            wait_for_workers=False,
            master_listen_fd=listener.detach(),
            use_libuv=True,
        )
        return cls(store, host)

    @classmethod
    def member_store(cls, host: str, store_host: str, store_port: int, init_timeout_s: float):
        """A target's store client, connected to the root's rendezvous."""
        from torch.distributed import TCPStore

        store = TCPStore(
            store_host, store_port, None, False, timedelta(seconds=init_timeout_s), use_libuv=True
        )
        return cls(store, host)

    def form(self, rank: int, world_size: int, init_timeout_s: float) -> None:
        """Build this member's process group: returns once every member has joined and
        gloo's connections between them all are up (the group's set-up cost)."""
        from torch.distributed import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        opts._devices = [ProcessGroupGloo.create_device(hostname=self.host)]
        opts._timeout = timedelta(seconds=init_timeout_s)
        self.pg = ProcessGroupGloo(self.store, rank, world_size, opts)

    def start(
        self, algorithm: str, buffers: list[memoryview], rank: int, size: int, timeout_s: float
    ) -> list[Any]:
        """Start moving every buffer from rank 0, in order; one work handle per buffer, each
        done once this member holds (or, on the root, has put in) that buffer.
        `broadcast`: gloo's own collective, one per buffer (a binomial tree over whole
        tensors: the root sends each ceil(log2 size) times; gloo/broadcast.cc), run on the
        group's threads. `ring`: NCCL's ring order over gloo's point-to-point ops (a chain,
        block-pipelined): the root sends every buffer to rank 1, each other rank receives
        from rank - 1 and, once a buffer is in, passes it on (`forward`)."""
        import torch

        with warnings.catch_warnings():  # the root's read-only buffers are only read
            warnings.simplefilter("ignore", UserWarning)
            self.tensors = [torch.frombuffer(buf, dtype=torch.uint8) for buf in buffers]
        if algorithm == "broadcast":
            timeout = timedelta(seconds=timeout_s)
            return [self.pg.broadcast(t, 0, timeout) for t in self.tensors]
        if rank == 0:
            return [self.pg.send([t], 1, tag) for tag, t in enumerate(self.tensors)]
        return [self.pg.recv([t], rank - 1, tag) for tag, t in enumerate(self.tensors)]

    def forward(self, algorithm: str, index: int, rank: int, size: int) -> Any:
        """`ring`: pass buffer `index`, just received, on to rank + 1 (its work handle);
        None where there is nothing to pass on (the last rank, the root, `broadcast`)."""
        if algorithm != "ring" or rank == 0 or rank == size - 1:
            return None
        return self.pg.send([self.tensors[index]], rank + 1, index)

    def close(self, failed: bool) -> None:
        """Destroy the group: abort it after a failure, shut it down otherwise; then drop the
        store (the root's stops listening). After a failure this returns once the group's
        pending work has failed by its timeouts (gloo's abort does not wake a waiting op)."""
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort() if failed else pg.shutdown()
            except RuntimeError as e:  # already broken: it is going away either way
                log.info("gloo group %s: %s", "abort" if failed else "shutdown", e)
            del pg
        self.store = None
        self.tensors = []
