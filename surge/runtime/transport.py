"""Framed, authenticated, rate-capped connections between agents and their controller.

What flows: frames (`surge.wire`: 4-byte length, JSON header, raw payload). Payloads are
received straight into a buffer the caller supplies (a pre-allocated block buffer or shared
memory) with `sock_recv_into`: no StreamReader, no copies of the payload in Python (the
issue measured StreamReader.readexactly ten times slower than recv_into on loopback).
Every connection starts with a handshake (`runtime/handshake.py`) that proves both ends
know the cluster's shared token without sending it. With TLS configured (`runtime/security/tls.py`)
the TLS handshake comes first and every frame after it is encrypted (`runtime/security/channel.py`);
without, the payload path stays zero-copy. Egress and ingress token buckets pace every
chunk. Owned by the runtime; the agent server and its clients both use `Connection`.
"""

import asyncio
import contextlib
import fcntl
import json
import logging
import socket
import ssl
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

from surge.errors import SurgeError
from surge.runtime.security.channel import PlainChannel, TlsChannel
from surge.runtime.token_bucket import TokenBucket
from surge.wire import HEADER_LEN, FrameError, check_header_len, parse_header

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
STALL_TIMEOUT_S = 8.0
"""A peer whose kernel acknowledges nothing for this long is dead (a link down for good, a
host gone): the socket fails with ETIMEDOUT and the connection counts as closed, so a pull
from it is re-planned and the controller marks the agent down. Idle connections are probed
(TCP keepalive) so a pull waiting for its reply notices too. A frozen process on a live host
still has its kernel answer: that case is bounded by the operation's own wait. The default
of every connection; a cluster may set its own (`ControllerConfig.stall_timeout_s`, `surge
serve --stall-timeout-s`; `AgentConfig.stall_timeout_s`, `ClusterClient`,
`LocalClusterConfig.stall_timeout_s`)."""
MIN_STALL_TIMEOUT_S = 3.0
"""The shortest stall bound: keepalive probes start after 2 s idle, one a second."""


def check_stall_timeout(timeout_s: float) -> float:
    """`timeout_s` if it is a usable stall bound, else a `SurgeError` naming the range."""
    if not MIN_STALL_TIMEOUT_S <= timeout_s <= 3600:
        raise SurgeError(
            f"the stall timeout must be {MIN_STALL_TIMEOUT_S:g} to 3600 s (got {timeout_s:g})"
        )
    return timeout_s


UNSENT_POLL_S = (0.0005, 0.01)
"""Bounds of the wait between two looks at a socket's unsent bytes (`wait_sent`): the wait
is the time the rest would take at the link's rate, within these."""


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes written to `sock` that its peer has not acknowledged yet (Linux SIOCOUTQ: the
    socket's send queue, including what sits in the qdisc); 0 where the platform has no
    such query."""
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return 0
    return struct.unpack("i", out)[0]


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (possibly in the middle of a frame)."""


class RemoteError(RuntimeError):
    """The peer answered a request with an error."""


PayloadSink = Callable[[dict[str, Any]], memoryview | bytearray | None]
"""Given a frame header, where to put its payload (None: a fresh bytearray)."""
ChunkObserver = Callable[[memoryview, int], None]
"""Told of each read of a payload as it lands: the bytes and their offset in the payload."""


def _detect_stalls(sock: socket.socket, timeout_s: float) -> None:
    """Keepalive probes every second after 2 s idle, and a bound on unacknowledged data:
    either way a silent peer fails the socket after about `timeout_s` (Linux; elsewhere
    whatever of this the platform has)."""
    opts = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), 2),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), max(1, int(timeout_s) - 2)),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), int(timeout_s * 1000)),
    ]
    for level, opt, value in opts:
        if opt is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, opt, value)


MAX_PACE = 1e6
"""Most a frame's payload may be charged per byte (`Connection.send`'s `pace`)."""


def header_pace(header: dict[str, Any]) -> float:
    """The pacing charge a frame header asks for (1.0 when it names none)."""
    pace = header.get("pace", 1.0)
    if isinstance(pace, bool) or not isinstance(pace, int | float) or not 0 < pace <= MAX_PACE:
        raise FrameError(f"frame header pace must be a number in (0, {MAX_PACE:g}]")
    return float(pace)


def chunk_for(bucket: TokenBucket, charge: float) -> int:
    """Bytes per paced chunk when each byte costs `charge` tokens: the bucket's chunk of
    tokens, in bytes (at most 1 MiB, at least 16 KiB)."""
    return int(min(1 << 20, max(16 * 1024, bucket.chunk_bytes() / charge)))


class Connection:
    """One TCP connection carrying frames, usable from one asyncio loop."""

    def __init__(
        self,
        sock: socket.socket,
        egress: TokenBucket | None = None,
        ingress: TokenBucket | None = None,
        stall_timeout_s: float = STALL_TIMEOUT_S,
    ) -> None:
        """`stall_timeout_s`: how long a silent peer may go unnoticed (`STALL_TIMEOUT_S`)."""
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _detect_stalls(sock, stall_timeout_s)
        self.stall_timeout_s = stall_timeout_s
        self.sock = sock
        self.channel: PlainChannel | TlsChannel = PlainChannel(sock)
        """What frames are read from and written to (TLS once `start_tls` ran)."""
        self.egress = egress or TokenBucket(None)
        self.ingress = ingress or TokenBucket(None)
        self.lock = asyncio.Lock()
        """Held for one request/response exchange by clients sharing the connection."""
        self.closed = False
        self.peer: str | None = None

    async def start_tls(self, context: ssl.SSLContext, server_side: bool) -> None:
        """Run TLS on this connection from now on (before any frame)."""
        channel = TlsChannel(self.sock, context, server_side)
        await channel.handshake()
        self.channel = channel

    async def _recv_exactly(
        self,
        view: memoryview,
        paced: bool,
        on_chunk: ChunkObserver | None = None,
        charge: float = 1.0,
    ) -> None:
        got = 0
        try:
            while got < len(view):
                want = len(view) - got
                if paced:
                    # Pay for a chunk before reading it, so the last chunk of a block adds
                    # no trailing wait (paying after each read cost ~10 ms per block).
                    want = min(want, chunk_for(self.ingress, charge))
                    await self.ingress.consume(round(want * charge))
                # A payload's bytes are sure to come: the channel may wait for many at once
                # (SO_RCVLOWAT); a header is read as soon as it arrives.
                n = await self.channel.recv_into(view[got : got + want], sure=paced)
                if n == 0:
                    raise ConnectionClosed(f"peer closed after {got} of {len(view)} bytes")
                if paced and n < want:
                    self.ingress.refund(round((want - n) * charge))
                if on_chunk is not None:
                    on_chunk(view[got : got + n], got)
                got += n
        finally:
            if paced:
                self.channel.between_frames()

    async def _send_all(self, data: memoryview, paced: bool, charge: float = 1.0) -> None:
        if not paced or self.egress.unlimited:
            await self.channel.sendall(data)
            return
        step = chunk_for(self.egress, charge)
        for start in range(0, len(data), step):
            chunk = data[start : start + step]
            await self.egress.consume(round(len(chunk) * charge))
            await self.channel.sendall(chunk)

    async def send(
        self,
        header: dict[str, Any],
        payload: bytes | bytearray | memoryview = b"",
        pace: float = 1.0,
    ) -> None:
        """Send one frame; the payload is paced by the egress cap (and the receiver's
        ingress cap) as `pace` times its bytes, the header is not paced. `pace` != 1: GPU-time
        emulation's activations and K/V, whose real bytes stand for a different number of
        emulated bytes than the weights the caps are scaled for, and a real store's blocks,
        each standing for one equal emulated block (docs/emulation.md)."""
        body = memoryview(payload).cast("B")
        if not 0 < pace <= MAX_PACE:
            raise ValueError(f"pace must be in (0, {MAX_PACE:g}] (got {pace})")
        extra = {"pace": pace} if pace != 1.0 else {}
        head = json.dumps({**header, **extra, "length": len(body)}, separators=(",", ":"))
        try:
            await self._send_all(
                memoryview(HEADER_LEN.pack(len(head)) + head.encode()), paced=False
            )
            if len(body):
                await self._send_all(body, paced=True, charge=pace)
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as e:
            self.closed = True
            raise ConnectionClosed(str(e)) from None

    async def wait_sent(
        self, max_unsent_bytes: int, rate_bytes_per_s: float | None, timeout_s: float
    ) -> None:
        """Return once at most `max_unsent_bytes` of what was sent are still unacknowledged.

        Why: `send` returns when the kernel has taken the bytes, and on a kernel-shaped link
        the socket and its qdisc take a whole block at once; a caller that counts its link
        busy only until then (the agent's single egress port) would start the next send
        while this one still drains, and the two would share the link (measured on the
        netns cluster, 8 nodes: binomial multicast at 0.63 of the optimal schedule with
        overlapping sends, 0.96 when each waits). Gives up silently after `timeout_s`: a
        stalled peer fails the socket on its own (`STALL_TIMEOUT_S`)."""
        deadline = time.monotonic() + timeout_s
        lo, hi = UNSENT_POLL_S
        while (left := unsent_bytes(self.sock)) > max_unsent_bytes and not self.closed:
            if time.monotonic() >= deadline:
                return
            wait = (left - max_unsent_bytes) / rate_bytes_per_s if rate_bytes_per_s else hi
            await asyncio.sleep(min(hi, max(lo, wait)))

    async def recv(
        self, sink: PayloadSink | None = None, on_chunk: ChunkObserver | None = None
    ) -> tuple[dict[str, Any], memoryview]:
        """Receive one frame; its payload goes where `sink` says (paced by the ingress cap),
        and `on_chunk` sees each read of it as it lands."""
        try:
            prefix = bytearray(HEADER_LEN.size)
            await self._recv_exactly(memoryview(prefix), paced=False)
            (n,) = HEADER_LEN.unpack(prefix)
            check_header_len(n)
            raw = bytearray(n)
            await self._recv_exactly(memoryview(raw), paced=False)
            header = parse_header(raw)
            length = header["length"]
            target = sink(header) if sink is not None and length else None
            view = memoryview(target if target is not None else bytearray(length)).cast("B")
            if len(view) != length:
                raise FrameError(
                    f"payload of {length} bytes does not fit a {len(view)}-byte buffer"
                )
            if length:
                charge = header_pace(header)
                await self._recv_exactly(view, paced=True, on_chunk=on_chunk, charge=charge)
            return header, view
        except (ConnectionResetError, BrokenPipeError, TimeoutError) as e:
            # TimeoutError here is the kernel's ETIMEDOUT (`STALL_TIMEOUT_S`): no asyncio
            # timeout runs inside recv, a caller's wait_for cancels it instead.
            self.closed = True
            raise ConnectionClosed(str(e)) from None
        except ConnectionClosed:
            self.closed = True
            raise

    async def request(
        self,
        header: dict[str, Any],
        payload: bytes | bytearray | memoryview = b"",
        sink: PayloadSink | None = None,
        on_chunk: ChunkObserver | None = None,
        pace: float = 1.0,
    ) -> tuple[dict[str, Any], memoryview]:
        """Send a request and wait for its answer (one exchange at a time per connection);
        `pace` as in `send`. A request cancelled or failed once sent closes the connection
        (its answer would be out of step with the next request's)."""
        async with self.lock:
            try:
                await self.send(header, payload, pace)
                reply, body = await self.recv(sink, on_chunk)
            except BaseException:
                # Cancelled or failed mid-exchange: an answer may still come, and the next
                # exchange would read it as its own. The connection is done.
                self.close()
                raise
        if not reply.get("ok", False):
            raise RemoteError(reply.get("error", "request failed"))
        return reply, body

    def shut(self) -> None:
        """End the connection both ways now: a coroutine waiting to read it sees the end at
        once (closing the socket alone would leave it waiting)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()
