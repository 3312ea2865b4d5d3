"""The HTTP API's listening socket, made before anything starts (so a taken port is one
`error:` line, not a traceback after the agents came up). Used by `surge serve` and
`surge dashboard`; `check_port` by them and `surge node run` (whose agent binds itself).
"""

import errno
import os
import socket

from surge.errors import SurgeError


def check_port(port: int, flag: str = "--port") -> None:
    """One `SurgeError` line for a port no socket can bind (Python's OverflowError traceback
    where the socket is made: `surge node run --port 99999`)."""
    if not 0 <= port < 65536:
        raise SurgeError(f"{flag} must be 0..65535 (got {port})")


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening socket on host:port for the API, or one `SurgeError` line saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        # proto IPPROTO_TCP, not 0 (what `socket.create_server` makes): asyncio turns Nagle
        # off (TCP_NODELAY) only on accepted sockets whose proto says TCP, and with Nagle on
        # every response of more than one write waited ~40 ms for a delayed ACK (issue 36:
        # /health answered in 45 ms on an idle server, 6 ms after this).
        sock = socket.socket(family, kind, proto)
        try:
            if os.name != "nt":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(2048)
        except BaseException:
            sock.close()
            raise
        return sock
    except OSError as e:
        # A host that does not resolve is a gaierror: its errno is getaddrinfo's (EAI_*, < 0),
        # which os.strerror calls "Unknown error -2"; its strerror says what it is.
        if isinstance(e, socket.gaierror) or not e.errno:
            why = e.strerror or str(e)
        else:
            why = os.strerror(e.errno)
        hint = (
            "; stop what listens there or pick another --port (0: any free port)"
            if e.errno == errno.EADDRINUSE
            else ""
        )
        raise SurgeError(f"cannot listen on {host}:{port}: {why}{hint}") from None
