"""JSON <-> frozen dataclass for the agent protocol (`runtime/protocol.py` is the front door).

What flows: a frame header (a JSON object) in, a typed message out, and back. Each field is
decoded by its type hint — int, float, str, bool, Literal, `X | None`, `tuple[X, ...]`,
fixed tuples, `dict[K, V]`, or any class with `to_json`/`from_json` (SamplingParams,
BatchMeta, Manifest) — and a value of the wrong type raises a `SurgeError` that names the
message and the field. Range checks live in each message's `__post_init__`. Owned by the
runtime; nothing here knows any op by name.
"""

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Literal, Self, Union

from surge.errors import SurgeError

ENVELOPE_KEYS = frozenset({"op", "type", "kind", "length", "ok"})
"""Keys a frame header carries besides a message's own fields (its name, the frame length,
the reply status); never treated as fields."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _bad(where: str, name: str, want: str, v: Any) -> SurgeError:
    shown = repr(v) if len(repr(v)) < 60 else repr(v)[:57] + "..."
    return SurgeError(f"{where}: field {name!r} must be {want} (got {shown})")


def decode_value(tp: Any, v: Any, where: str, name: str) -> Any:
    """`v` (parsed JSON) as a value of type `tp`, or a SurgeError naming the field."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return decode_value(inner, v, where, name)
    if origin is Literal:
        if v not in args:
            raise _bad(where, name, " or ".join(map(repr, args)), v)
        return v
    if tp is bool:
        if not isinstance(v, bool):
            raise _bad(where, name, "true or false", v)
        return v
    if tp is int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise _bad(where, name, "an integer", v)
        return v
    if tp is float:
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise _bad(where, name, "a number", v)
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise _bad(where, name, "a string", v)
        return v
    if origin is tuple:
        if not isinstance(v, list | tuple):
            raise _bad(where, name, "a list", v)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode_value(args[0], x, where, name) for x in v)
        if len(v) != len(args):
            raise _bad(where, name, f"a list of {len(args)}", v)
        return tuple(decode_value(a, x, where, name) for a, x in zip(args, v, strict=True))
    if origin is dict:
        if not isinstance(v, dict):
            raise _bad(where, name, "an object", v)
        key_tp, val_tp = args
        out = {}
        for k, x in v.items():
            if key_tp is int:  # JSON object keys are strings
                try:
                    k = int(k)
                except ValueError:
                    raise _bad(where, name, "an object with integer keys", v) from None
            out[k] = decode_value(val_tp, x, where, f"{name}[{k!r}]")
        return out
    if hasattr(tp, "from_json"):
        if not isinstance(v, dict):
            raise _bad(where, name, f"a {tp.__name__} object", v)
        try:
            return tp.from_json(v)
        except SurgeError as e:
            raise SurgeError(f"{where}: field {name!r}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise SurgeError(f"{where}: field {name!r} is not a valid {tp.__name__}: {e}") from None
    raise TypeError(f"{where}: no JSON decoding for field {name!r} of type {tp!r}")


def encode_value(v: Any) -> Any:
    """A field value as plain JSON data (tuples as lists, integer keys as strings)."""
    if hasattr(v, "to_json"):
        return v.to_json()
    if isinstance(v, tuple | list):
        return [encode_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): encode_value(x) for k, x in v.items()}
    return v


@dataclass(frozen=True)
class Message:
    """A typed JSON object: fields from the dataclass, defaults in the dataclass.

    Subclasses add their own envelope key (`"op"`, `"type"`) in `to_json`. A field whose
    value is None and whose default is None is left out of the JSON, as the old dict
    senders did."""

    STRICT: ClassVar[bool] = False
    """Refuse unknown keys (requests: a typo must not pass silently). Replies and events
    accept them, so an older reader keeps working when a newer agent adds one."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.default is None:
                continue
            out[f.name] = encode_value(v)
        return out

    @classmethod
    def _where(cls) -> str:
        return cls.__name__

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Self:
        where = cls._where()
        if not isinstance(d, Mapping):
            raise SurgeError(f"{where}: expected a JSON object (got {type(d).__name__})")
        hints = _hints(cls)
        known = {f.name for f in fields(cls)}
        if cls.STRICT:
            extra = sorted(set(d) - known - ENVELOPE_KEYS)
            if extra:
                raise SurgeError(
                    f"{where}: unknown field(s) {extra}; known fields are {sorted(known)}"
                )
        kwargs = {}
        for f in fields(cls):
            if f.name in d:
                kwargs[f.name] = decode_value(hints[f.name], d[f.name], where, f.name)
            elif f.default is MISSING and f.default_factory is MISSING:
                raise SurgeError(f"{where}: missing field {f.name!r}")
        return cls(**kwargs)


def register(registry: dict[str, type], name: str, cls: type, what: str) -> None:
    """Add a message class to its registry (op or event names), once."""
    if name in registry:
        raise TypeError(f"{what} {name!r} is defined twice")
    registry[name] = cls


def decode_named(registry: dict[str, type[Message]], key: str, d: Any, what: str) -> Any:
    """The message of the class `d[key]` names; a SurgeError names an unknown name."""
    name = d.get(key) if isinstance(d, Mapping) else None
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise SurgeError(f"unknown {what} {name!r}; known: {sorted(registry)}")
    return cls.from_json(d)


def require(ok: bool, where: str, message: str) -> None:
    """A range check of `__post_init__`: raise a SurgeError naming the message."""
    if not ok:
        raise SurgeError(f"{where}: {message}")
