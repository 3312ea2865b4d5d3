"""The byte stream under a `Connection`: the socket itself, or TLS over it.

What flows: bytes, read into a buffer the caller gives (`recv_into`) and written from one
(`sendall`). `PlainChannel` is the socket with the event loop's `sock_recv_into` and
`sock_sendall`: the payload lands where the caller wants it, no copy in Python (the data
path's zero copy). `TlsChannel` runs TLS (`ssl.SSLObject` over memory BIOs) on the same
non-blocking socket, so the connection keeps its socket for pacing, SO_RCVLOWAT and
SIOCOUTQ: records are read into one reusable buffer and decrypted straight into the
caller's (one copy, the decryption). asyncio's own TLS (streams, `start_tls`) would put a
StreamReader with its copies back on the data path. Owned by the runtime (`transport.py`).
"""

import asyncio
import contextlib
import socket
import ssl

RECV_LOWAT_BYTES = 256 << 10
"""While a payload arrives, the socket wakes its reader only once this much (or the rest of
the payload) is waiting (SO_RCVLOWAT). Why: on a slow link bytes trickle in a packet or
two at a time, and each wake-up costs a turn of the event loop: on the netns cluster (8
nodes, 0.5 Gbit/s, a quarter core each) receiving agents used 28% less CPU with the mark
(0.74 vs 1.04 cores in all, 4 A/B pairs). 256 KiB is ~4 ms at 0.5 Gbit/s."""


class RecvLowat:
    """A socket's SO_RCVLOWAT as last set (1, the kernel's default, between frames)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.num_bytes = 1

    def set(self, num_bytes: int) -> None:
        num_bytes = max(1, min(num_bytes, RECV_LOWAT_BYTES))
        if num_bytes != self.num_bytes:
            with contextlib.suppress(OSError):  # platforms without SO_RCVLOWAT on TCP
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, num_bytes)
            self.num_bytes = num_bytes


TLS_READ_BYTES = 256 << 10
"""Encrypted bytes read from the socket at once (one reusable buffer per connection)."""
TLS_RECORD_BYTES = (16 << 10) + 2048
"""The most a TLS record may take on the wire (16 KiB of data plus the largest expansion
the standard allows): what OpenSSL may hold of a partial record, out of the BIO's count."""
TLS_WRITE_BYTES = 256 << 10
"""Plain bytes encrypted at once before they are written (bounds the outgoing buffer)."""


class PlainChannel:
    """The socket as it is."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lowat = RecvLowat(sock)

    def between_frames(self) -> None:
        """The next read is a header: wake on its first byte."""
        self.lowat.set(1)

    async def recv_into(self, view: memoryview, sure: bool = False) -> int:
        """Up to len(view) bytes into `view`; 0 when the peer closed. `sure`: all of them
        are sure to come (a payload), so the reader may wake only once many are here."""
        if sure:
            self.lowat.set(len(view))
        return await asyncio.get_running_loop().sock_recv_into(self.sock, view)

    async def sendall(self, view: memoryview) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, view)


class TlsHandshakeError(ConnectionError):
    """The TLS handshake failed: a certificate the other side does not trust, or a peer
    that does not speak TLS."""


def describe(e: ssl.SSLError) -> str:
    """A TLS failure in words ("certificate verify failed: ...", "tlsv1 alert unknown ca")."""
    if isinstance(e, ssl.SSLCertVerificationError) and e.verify_message:
        return f"certificate verify failed: {e.verify_message}"
    if e.reason == "WRONG_VERSION_NUMBER":
        return "the peer does not speak TLS (give it --tls-cert/--tls-key/--tls-ca)"
    return (e.reason or str(e)).lower().replace("_", " ")


class TlsChannel:
    """TLS over a non-blocking socket, driven by hand (memory BIOs)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool) -> None:
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=server_side)
        self._raw = bytearray(TLS_READ_BYTES)
        self._write_lock = asyncio.Lock()
        self.lowat = RecvLowat(sock)

    def between_frames(self) -> None:
        self.lowat.set(1)

    async def handshake(self) -> None:
        """Run the TLS handshake (the caller bounds it in time)."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._read_socket():
                    raise TlsHandshakeError(
                        "the peer closed the connection during the TLS handshake (it refused "
                        "our certificate, or it does not use TLS)"
                    ) from None
            except ssl.SSLError as e:
                await self._flush()  # the alert tells the peer why
                raise TlsHandshakeError(f"TLS handshake failed: {describe(e)}") from None
        await self._flush()

    async def _read_socket(self) -> int:
        n = await asyncio.get_running_loop().sock_recv_into(self.sock, self._raw)
        if n:
            self._in.write(memoryview(self._raw)[:n])
        else:
            self._in.write_eof()
        return n

    async def _flush(self) -> None:
        async with self._write_lock:
            if self._out.pending:
                await asyncio.get_running_loop().sock_sendall(self.sock, self._out.read())

    async def recv_into(self, view: memoryview, sure: bool = False) -> int:
        """Up to len(view) decrypted bytes into `view`; 0 when the peer closed. `sure`: all
        of them are sure to come, so each socket read may wait for many."""
        got = 0
        while True:
            try:
                # One record per read: take every record already here before returning,
                # so a large payload costs few turns of the caller's loop.
                while got < len(view):
                    n = self._tls.read(len(view) - got, view[got:])
                    if n == 0:
                        break
                    got += n
            except ssl.SSLWantReadError:
                if not got:
                    if sure:
                        # The socket owes at least what is wanted less what it already gave:
                        # decrypted, still in the BIO, or one partial record OpenSSL holds
                        # inside (not counted by either). Never wait for more than that.
                        given = self._tls.pending() + self._in.pending + TLS_RECORD_BYTES
                        self.lowat.set(len(view) - given)
                    if not await self._read_socket():
                        return 0
                    continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                pass  # closed: what was read is returned, the next read returns 0
            if self._out.pending:  # a post-handshake message wants an answer
                await self._flush()
            return got

    async def sendall(self, view: memoryview) -> None:
        for start in range(0, len(view), TLS_WRITE_BYTES):
            self._tls.write(view[start : start + TLS_WRITE_BYTES])
            await self._flush()
