"""Every event an agent emits (and `agent_down`, which the client makes), as dataclasses.

What flows: the agent's event stream sends `{"kind": "event", "type": ..., "node", "t",
...fields}`; `ClusterClient` decodes each with `Event.decode` and hands it only to the
subscribers that asked for its class (and model). The JSON is what the agent sent as
dicts before. Owned by the runtime (see docs/runtime.md, Protocol).
"""

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from surge.json_codec import Named, Registry

EVENTS = Registry("type", "event")
"""Event type name -> its class. Filled by each class definition."""


@dataclass(frozen=True, kw_only=True)
class Event(Named):
    """Something that happened on a node. Subclasses name themselves: `class X(Event, name=...)`;
    `Event.decode(d)` gives the typed event of an event frame (a SurgeError names an
    unknown type or a bad field)."""

    REGISTRY: ClassVar[Registry] = EVENTS

    node: int
    """The agent it happened on."""
    t: float
    """Wall-clock time (time.time()) it happened."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "event", **super().to_json()}

    @property
    def model_name(self) -> str | None:
        """The model this event is about (None: not about one model)."""
        return getattr(self, "model", None)


@dataclass(frozen=True, kw_only=True)
class BlockArrived(Event, name="arrival"):
    """A verified block is usable in its tier (`t`: when it landed). A `load` sets
    `source`; a multicast pull sets `mc_id`, `src` and `step`."""

    model: str
    block: int
    tier: Literal["host", "gpu"]
    source: str | None = None
    mc_id: str | None = None
    src: int | None = None
    step: float | None = None
    digest: str | None = None
    """The version of the model the block is of (`Manifest.digest`; None: not reported): the
    controller counts a copy only of its deployment's version (`policy.versions`)."""


@dataclass(frozen=True, kw_only=True)
class ReceiveDone(Event, name="receive_done"):
    """A node went through its whole receive list of a multicast."""

    mc_id: str
    model: str


@dataclass(frozen=True, kw_only=True)
class BlockCorrupt(Event, name="corrupt"):
    """A pulled block failed its checksum; it is pulled again."""

    mc_id: str
    model: str
    block: int
    src: int


@dataclass(frozen=True, kw_only=True)
class PullFailed(Event, name="pull_failed"):
    """A pull could not complete (source down, repeated corruption): name another holder
    with `pull_from`."""

    mc_id: str
    model: str
    block: int
    src: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class TokenGenerated(Event, name="token"):
    """A local instance generated a token of a request."""

    instance: str
    req_id: str
    token: int
    finished: bool
    finish_reason: str | None
    """Why it finished ("stop", "length"; None while it goes on). Always sent."""
    model: str | None = None
    """The instance's model (so a subscriber can ask for one model's tokens)."""
    logprob: float | None = None
    """The token's log-probability, only when the request asked (`SamplingParams.logprobs`)."""
    top_logprobs: tuple[tuple[int, float], ...] | None = None
    """The most likely (token id, log-probability) pairs, when asked."""
    cached_tokens: int | None = None
    """On a request's first token: its prompt tokens served from the prefix cache."""


@dataclass(frozen=True, kw_only=True)
class RequestFailed(Event, name="request_failed"):
    """A local instance could not go on with a request (its engine step raised): the
    controller fails it with `error` instead of waiting for tokens that will not come."""

    instance: str
    req_id: str
    error: str
    model: str | None = None
    """The instance's model (so a subscriber can ask for one model's failures)."""


@dataclass(frozen=True, kw_only=True)
class AgentDown(Event, name="agent_down"):
    """The agent's event stream ended (it died or stopped). Made by the client."""
