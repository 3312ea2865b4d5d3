"""Frames: a small JSON header followed by raw bytes. The only format that crosses a process
boundary in surge (never pickle).

Layout: 4-byte big-endian header length, the UTF-8 JSON header, then `header["length"]`
payload bytes. Used by the engine to serialize hidden states and by the runtime transport.
"""

import json
import struct
from typing import Any

HEADER_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20


class FrameError(ValueError):
    """A frame that does not parse: wrong lengths or a bad header."""


def check_header_len(n: int) -> None:
    """A frame's header length prefix must be within bounds."""
    if not 0 < n <= MAX_HEADER_BYTES:
        raise FrameError(f"frame header length {n} is invalid")


def parse_header(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """A frame header: a JSON object with a non-negative integer `length` (the only parser
    of headers; every reader of frames uses it)."""
    try:
        header = json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FrameError(f"frame header is not JSON: {e}") from None
    length = header.get("length") if isinstance(header, dict) else None
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise FrameError("frame header must be an object with a non-negative integer length")
    return header


def encode_frame(header: dict[str, Any], payload: bytes | bytearray | memoryview = b"") -> bytes:
    """One frame as bytes (header gets `length` = payload size)."""
    payload = memoryview(payload).cast("B")
    head = json.dumps({**header, "length": len(payload)}, separators=(",", ":")).encode()
    return b"".join((HEADER_LEN.pack(len(head)), head, payload))


def decode_frame(buf: bytes | bytearray | memoryview) -> tuple[dict[str, Any], memoryview]:
    """Split one frame into its header and a zero-copy view of its payload."""
    view = memoryview(buf).cast("B")
    if len(view) < HEADER_LEN.size:
        raise FrameError("frame shorter than its length prefix")
    (n,) = HEADER_LEN.unpack_from(view)
    check_header_len(n)
    if HEADER_LEN.size + n > len(view):
        raise FrameError(f"frame header length {n} is longer than the frame")
    header = parse_header(view[HEADER_LEN.size : HEADER_LEN.size + n])
    start = HEADER_LEN.size + n
    payload = view[start : start + header["length"]]
    if len(payload) != header["length"]:
        raise FrameError(f"frame payload has {len(payload)} bytes, header says {header['length']}")
    return header, payload


def read_frame(stream) -> tuple[dict[str, Any], bytearray] | None:
    """Read one frame from a blocking binary stream; None at a clean end of stream."""
    prefix = stream.read(HEADER_LEN.size)
    if not prefix:
        return None
    if len(prefix) != HEADER_LEN.size:
        raise FrameError("stream ended inside a frame prefix")
    (n,) = HEADER_LEN.unpack(prefix)
    check_header_len(n)
    raw = stream.read(n)
    if len(raw) != n:
        raise FrameError("stream ended inside a frame header")
    header = parse_header(raw)
    payload = bytearray(header["length"])
    view = memoryview(payload)
    got = 0
    while got < len(payload):
        k = stream.readinto(view[got:])
        if not k:
            raise FrameError("stream ended inside a frame payload")
        got += k
    return header, payload
