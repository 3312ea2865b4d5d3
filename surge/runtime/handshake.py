"""The hello every surge connection starts with: each end proves it knows the cluster's
shared token without sending it (HMAC-SHA256 over two fresh nonces, compared in constant
time); a wrong token is refused and the connection closed. With TLS configured
(`runtime/security/tls.py`) the TLS handshake comes first.

What flows: a fresh socket in, a `transport.Connection` out (client side: `connect`), or the
peer's name (server side: `accept_hello`). Owned by the runtime.
"""

import asyncio
import hashlib
import hmac
import secrets
import socket
import ssl

from surge.runtime.security.channel import TlsHandshakeError
from surge.runtime.token_bucket import TokenBucket
from surge.runtime.transport import STALL_TIMEOUT_S, Connection, ConnectionClosed

PROTOCOL_VERSION = 2
"""2: the token is proven (HMAC over nonces), never sent; 1 sent it in its hello."""


class AuthError(ConnectionError):
    """The peer refused our token, or presented a wrong one."""


def _proof(token: str, side: str, client_nonce: str, server_nonce: str) -> str:
    """What one side sends to prove it knows the token: HMAC-SHA256 keyed by the token over
    both nonces and the side's name (so a proof cannot be replayed, nor reflected back)."""
    msg = f"surge-hello|{side}|{client_nonce}|{server_nonce}".encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def _proof_ok(got: object, want: str) -> bool:
    return isinstance(got, str) and hmac.compare_digest(got.encode(), want.encode())


async def connect(
    host: str,
    port: int,
    token: str,
    me: str,
    egress: TokenBucket | None = None,
    ingress: TokenBucket | None = None,
    timeout_s: float = 10.0,
    tls: ssl.SSLContext | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> Connection:
    """Open a connection (TLS first when `tls` is given, the client context of
    `ClusterTls`) and prove the cluster token; the agent proves it too. A peer silent for
    `stall_timeout_s` fails it (`transport.STALL_TIMEOUT_S`), from the first SYN on."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        # A host whose kernel answers no SYN for the stall bound is as gone as one that stops
        # acknowledging data (a link down for good: a node that re-dials it gave up only after
        # the full `timeout_s` of 10 s, after the others had re-planned in 3).
        async with asyncio.timeout(min(timeout_s, stall_timeout_s)):
            await loop.sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    conn = Connection(sock, egress, ingress, stall_timeout_s)
    conn.peer = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout_s):
            await _client_handshake(conn, token, me, tls)
    except TlsHandshakeError as e:
        conn.close()
        raise AuthError(f"{conn.peer}: {e}") from None
    except ConnectionClosed as e:
        conn.close()
        hint = "" if tls else " (does it use TLS? then give --tls-cert/--tls-key/--tls-ca)"
        raise AuthError(f"{conn.peer} closed the connection during the hello{hint}: {e}") from None
    except BaseException:
        conn.close()
        raise
    return conn


async def _client_handshake(
    conn: Connection, token: str, me: str, tls: ssl.SSLContext | None
) -> None:
    if tls is not None:
        await conn.start_tls(tls, server_side=False)
    nonce = secrets.token_hex(16)
    await conn.send({"kind": "hello", "from": me, "version": PROTOCOL_VERSION, "nonce": nonce})
    reply, _ = await conn.recv()
    if reply.get("kind") != "challenge":
        raise AuthError(reply.get("error", "connection refused"))
    theirs = str(reply.get("nonce", ""))
    # Our proof goes first either way, so a refused peer logs the refusal on its side too.
    await conn.send({"kind": "proof", "proof": _proof(token, "client", nonce, theirs)})
    if not _proof_ok(reply.get("proof"), _proof(token, "agent", nonce, theirs)):
        raise AuthError(f"wrong cluster token: {conn.peer} and this process do not share one")
    reply, _ = await conn.recv()
    if reply.get("kind") != "welcome":
        raise AuthError(reply.get("error", "connection refused"))


async def accept_hello(
    conn: Connection,
    token: str,
    me: str,
    timeout_s: float = 10.0,
    tls: ssl.SSLContext | None = None,
) -> str:
    """Server side of the handshake (TLS first when `tls` is given, the server context of
    `ClusterTls`): check the peer's proof of the token, answer, return who connected."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _server_handshake(conn, token, me, tls)
    except TlsHandshakeError as e:
        raise AuthError(f"refused a connection from {conn.peer}: {e}") from None


async def _server_handshake(
    conn: Connection, token: str, me: str, tls: ssl.SSLContext | None
) -> str:
    if tls is not None:
        await conn.start_tls(tls, server_side=True)
    header, _ = await conn.recv()
    who = header.get("from")
    if header.get("kind") != "hello" or header.get("version") != PROTOCOL_VERSION:
        error = f"expected a hello of protocol version {PROTOCOL_VERSION}"
        await conn.send({"kind": "error", "ok": False, "error": error})
        raise AuthError(f"refused a connection from {who!r} ({conn.peer}): {error}")
    theirs, nonce = str(header.get("nonce", "")), secrets.token_hex(16)
    mine = _proof(token, "agent", theirs, nonce)
    await conn.send({"kind": "challenge", "nonce": nonce, "proof": mine})
    header, _ = await conn.recv()
    if header.get("kind") != "proof" or not _proof_ok(
        header.get("proof"), _proof(token, "client", theirs, nonce)
    ):
        await conn.send({"kind": "error", "ok": False, "error": "wrong cluster token"})
        raise AuthError(f"refused a connection from {who!r} ({conn.peer}): wrong token")
    await conn.send({"kind": "welcome", "ok": True, "node": me})
    return str(who)
