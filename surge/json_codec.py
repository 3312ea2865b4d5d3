"""JSON <-> frozen dataclass: the one typed codec of surge's messages.

What flows: a frame header (a JSON object) in, a typed message out, and back. Each field is
decoded by its type hint — int, float, str, bool, Literal, `X | None`, `tuple[X, ...]`,
fixed tuples, `dict[K, V]`, or any class with `to_json`/`from_json` (SamplingParams,
BatchMeta, Manifest) — and a value of the wrong type raises a `SurgeError` that names the
message and the field. Range checks live in each message's `__post_init__`. A family of
messages named by an envelope key (the agent's ops and events, the dashboard's timeline
events) is a `Registry` that its `Named` classes fill: one way to name, register, encode
and decode all of them. Used by the agent protocol (`runtime/protocol/`) and the timeline
(`events.py`); nothing here knows any message by name. Imports nothing of surge but `errors.py`.
"""

import functools
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Literal, Self, Union

from surge.errors import SurgeError

ENVELOPE_KEYS = frozenset({"op", "type", "kind", "length", "ok", "pace"})
"""Keys a frame header carries besides a message's own fields (its name, the frame length,
the reply status, the payload's pacing charge: `runtime/transport.py`); never treated as
fields."""


Decode = Callable[[Any, str, str], Any]
"""A field decoder: (JSON value, message name, field name) -> the typed value."""

_SCALARS = (int, float, str, bool, type(None))


def _bad(where: str, name: str, want: str, v: Any) -> SurgeError:
    shown = repr(v) if len(repr(v)) < 60 else repr(v)[:57] + "..."
    return SurgeError(f"{where}: field {name!r} must be {want} (got {shown})")


def _scalar(kind: type, want: str) -> Decode:
    def decode(v: Any, where: str, name: str) -> Any:
        if type(v) is kind:  # exact: bool is not an int here
            return v
        if kind is float and type(v) is int:
            return float(v)
        raise _bad(where, name, want, v)

    return decode


@functools.cache
def decoder(tp: Any) -> Decode:
    """The decoder of a field type (built once per type: decoding is on the block path)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return lambda v, where, name: v
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        dec = decoder(inner)
        return lambda v, where, name: None if v is None else dec(v, where, name)
    if origin is Literal:
        want = " or ".join(map(repr, args))

        def literal(v: Any, where: str, name: str) -> Any:
            if v not in args:
                raise _bad(where, name, want, v)
            return v

        return literal
    wants = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp in wants:
        return _scalar(tp, wants[tp])
    if origin is tuple:
        return _tuple_decoder(args)
    if origin is dict:
        return _dict_decoder(*args)
    if hasattr(tp, "from_json"):
        return _object_decoder(tp)
    raise TypeError(f"no JSON decoding for type {tp!r}")


def _tuple_decoder(args: tuple) -> Decode:
    homogeneous = len(args) == 2 and args[1] is Ellipsis
    decs = [decoder(args[0])] if homogeneous else [decoder(a) for a in args]

    def decode(v: Any, where: str, name: str) -> tuple:
        if not isinstance(v, list | tuple):
            raise _bad(where, name, "a list", v)
        if homogeneous:
            return tuple(decs[0](x, where, name) for x in v)
        if len(v) != len(decs):
            raise _bad(where, name, f"a list of {len(decs)}", v)
        return tuple(d(x, where, name) for d, x in zip(decs, v, strict=True))

    return decode


def _dict_decoder(key_tp: Any, val_tp: Any) -> Decode:
    dec = decoder(val_tp)

    def decode(v: Any, where: str, name: str) -> dict:
        if not isinstance(v, dict):
            raise _bad(where, name, "an object", v)
        out = {}
        for k, x in v.items():
            if key_tp is int:  # JSON object keys are strings
                try:
                    k = int(k)
                except ValueError:
                    raise _bad(where, name, "an object with integer keys", v) from None
            out[k] = dec(x, where, f"{name}[{k!r}]")
        return out

    return decode


def _object_decoder(tp: Any) -> Decode:
    def decode(v: Any, where: str, name: str) -> Any:
        if not isinstance(v, dict):
            raise _bad(where, name, f"a {tp.__name__} object", v)
        try:
            return tp.from_json(v)
        except SurgeError as e:
            raise SurgeError(f"{where}: field {name!r}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise SurgeError(f"{where}: field {name!r} is not a valid {tp.__name__}: {e}") from None

    return decode


def encode_value(v: Any) -> Any:
    """A field value as plain JSON data (tuples as lists, integer keys as strings)."""
    if type(v) in _SCALARS:
        return v
    if hasattr(v, "to_json"):
        return v.to_json()
    if isinstance(v, tuple | list):
        return [encode_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): encode_value(x) for k, x in v.items()}
    return v


@dataclass(frozen=True)
class _Field:
    name: str
    decode: Decode
    required: bool
    omit_none: bool
    """Left out of the JSON when None (its default is None)."""


@functools.cache
def _schema(cls: type) -> tuple[tuple[_Field, ...], frozenset[str]]:
    """A message class's fields, decoders and names, worked out once."""
    hints = typing.get_type_hints(cls)
    out = tuple(
        _Field(
            f.name,
            decoder(hints[f.name]),
            f.default is MISSING and f.default_factory is MISSING,
            f.default is None,
        )
        for f in fields(cls)
    )
    return out, frozenset(f.name for f in out)


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
        for f in _schema(type(self))[0]:
            v = getattr(self, f.name)
            if v is None and f.omit_none:
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
        schema, known = _schema(cls)
        if cls.STRICT and not known.issuperset(d.keys() - ENVELOPE_KEYS):
            extra = sorted(set(d) - known - ENVELOPE_KEYS)
            raise SurgeError(f"{where}: unknown field(s) {extra}; known fields are {sorted(known)}")
        kwargs = {}
        for f in schema:
            if f.name in d:
                kwargs[f.name] = f.decode(d[f.name], where, f.name)
            elif f.required:
                raise SurgeError(f"{where}: missing field {f.name!r}")
        return cls(**kwargs)


class Registry(Mapping[str, type]):
    """One family of named messages (the agent's ops, its events, the timeline's events):
    name -> class, filled by each class definition (`Named`), and the JSON key that
    carries the name."""

    def __init__(self, key: str, family: str) -> None:
        self.key = key
        """The envelope key holding a message's name (`"op"`, `"type"`)."""
        self.family = family
        """What its messages are, for errors ("op", "event", "timeline event")."""
        self._classes: dict[str, type] = {}

    def add(self, name: str, cls: type) -> None:
        """Register `cls` under `name`, once."""
        if name in self._classes:
            raise TypeError(f"{self.family} {name!r} is defined twice")
        self._classes[name] = cls

    def decode(self, d: Any) -> Any:
        """The message of the class `d[key]` names, each field checked against its type; a
        SurgeError names an unknown name or a bad field."""
        name = d.get(self.key) if isinstance(d, Mapping) else None
        cls = self._classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise SurgeError(f"unknown {self.family} {name!r}; known: {sorted(self._classes)}")
        return cls.from_json(d)

    def __getitem__(self, name: str) -> type:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)


@dataclass(frozen=True)
class Named(Message):
    """A message of a family: `class X(Base, name="...")` names it and adds it to the
    family's `REGISTRY` (which the family's base sets); its JSON carries the name under the
    registry's key, before its fields. `Base.decode(d)` gives the typed message of any
    member of the family."""

    REGISTRY: ClassVar[Registry]
    NAME: ClassVar[str] = ""

    def __init_subclass__(cls, name: str = "", **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if name:
            cls.NAME = name
            cls.REGISTRY.add(name, cls)

    @classmethod
    def _where(cls) -> str:
        return f"{cls.REGISTRY.family} {cls.NAME}"

    def to_json(self) -> dict[str, Any]:
        return {self.REGISTRY.key: self.NAME, **super().to_json()}

    @classmethod
    def decode(cls, d: Any) -> Self:
        """The typed message of a JSON object of this family (`Registry.decode`)."""
        return cls.REGISTRY.decode(d)


def require(ok: bool, where: str, message: str) -> None:
    """A range check of `__post_init__`: raise a SurgeError naming the message."""
    if not ok:
        raise SurgeError(f"{where}: {message}")
