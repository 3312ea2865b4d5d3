"""Which version of a model a copy is, and what registering another version under its name
does: a serving platform never serves stale weights, nor mixes blocks of two versions.

A model's version is its manifest's digest (`Manifest.digest`: a SHA-256 of its
architecture, blocks and each block's checksum). Agents and the controller key copies by
model name; the version makes the name's copies one version's:
- an agent's `register` of the version it holds changes nothing; of another version it
  replaces the old one (every copy in every tier goes first), unless a running local
  instance or pipeline stage uses the old weights: then it is refused, naming what runs and
  the fix (`decide_register`);
- a copy of another version is no copy of the deployment's model: never a source of a
  load, a multicast, a mate's device copy or a warm start, never counted in the parameter
  pool (`same_version`); the controller drops another version on a node before it
  registers a deployment there (`other_versions`);
- K/V is of the version whose weights computed it: an instance or stage takes K/V (a P/D
  hand-off, a live batch's, a consolidation's, a FlexPipe refactoring's `kv_import`) only
  from its own version, and a pipeline stage opens only at the version its pipeline runs:
  decoding on another version's K/V, or a layer on another version's hidden states, is
  silent garbage (`refuse_kv`, `refuse_stage`);
- a deployment restored after a controller restart serves the version the model store holds
  now; the version it recorded (none: a state file from before versions were recorded) says
  whether the model was replaced meanwhile (`decide_restore`).
"" is the digest of an agent or event that reports none: never the same as any version.
Pure and deterministic: no I/O, no clock.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

RegisterAction = Literal["new", "same", "replace", "refuse"]


@dataclass(frozen=True)
class RegisterDecision:
    """What an agent does with a `register` of `model`."""

    action: RegisterAction
    """new: learn it; same: nothing (the version held); replace: drop every copy of the
    old version, then learn the new; refuse: answer `reason` as an error."""
    reason: str = ""
    """For `refuse`: the running users and the fix; for `replace`: which versions."""


def short(digest: str) -> str:
    """A digest as logs and errors show it (`sha256:` and 12 hex digits)."""
    return digest[:19] if digest else "no digest"


def same_version(held: str | None, wanted: str) -> bool:
    """Whether a copy whose version is `held` is a copy of version `wanted` (a source of it,
    counted as it); an unknown version ("" or None: not reported) never is."""
    return bool(held) and held == wanted


def decide_register(
    model: str, node: int, held: str | None, new: str, users: tuple[str, ...]
) -> RegisterDecision:
    """A `register` of `model` at version `new` on `node`, which holds version `held` (None:
    not registered) and runs `users` (its local instances and pipeline stages of the model)."""
    if held is None:
        return RegisterDecision("new")
    if held == new:
        return RegisterDecision("same")
    versions = f"{short(held)} -> {short(new)}"
    if not users:
        return RegisterDecision("replace", f"model {model!r} replaced on node {node}: {versions}")
    names = ", ".join(sorted(users))
    return RegisterDecision(
        "refuse",
        f"node {node} runs {names} on version {short(held)} of model {model!r}; version "
        f"{short(new)} can replace it only once nothing runs on it: close "
        f"{'them' if len(users) > 1 else 'it'} (instance_close / stage_close) or drop the "
        "model (drop_model, what deleting its deployment sends), then register again",
    )


def other_versions(held: Mapping[int, str], wanted: str) -> tuple[int, ...]:
    """Nodes holding the model at another version than `wanted` (`held`: node -> digest of
    what it holds), ascending: the controller drops it there before it registers `wanted`
    (its instances there are no deployment's: the deployment of a name is one version)."""
    return tuple(sorted(n for n, d in held.items() if not same_version(d, wanted)))


def refuse_as_source(model: str, node: int, held: str, wanted: str) -> str | None:
    """Why `node`, holding `model` at version `held`, must send none of it to a puller of
    version `wanted` (a peer's pull, a mate's device copy, a gloo group's root); None: it may
    (the same version, or `wanted` "": a caller that does not say, checked by checksum)."""
    if not wanted or held == wanted:
        return None
    return (
        f"node {node} holds version {short(held)} of model {model!r}, not {short(wanted)}: "
        "a copy of another version is no source of it"
    )


KV_REFUSED = "K/V of another version"
"""What every K/V refusal says (`refuse_kv`): how a controller tells it from a failure that
a retry may cure (`is_kv_refusal`)."""


def refuse_kv(model: str, node: int, held: str, sent: str) -> str | None:
    """Why `node`, running `model` at version `held`, must not take K/V that version `sent`
    computed; None: it may (the same version). A sender that does not say ("") is refused
    too: K/V has no checksum that would catch another version's."""
    if same_version(sent, held):
        return None
    return (
        f"node {node} runs version {short(held)} of model {model!r}; {KV_REFUSED} "
        f"({short(sent)}) is refused: decoding on it would be garbage (prefill again)"
    )


def is_kv_refusal(message: str) -> bool:
    """Whether an agent's error is `refuse_kv`'s (the request must be prefilled again by
    its own version: retrying the same K/V can never succeed)."""
    return KV_REFUSED in message


def refuse_stage(model: str, node: int, held: str, wanted: str) -> str | None:
    """Why `node`, holding `model` at version `held`, must not open a pipeline stage of a
    pipeline of version `wanted` (its layers would run on another version's hidden states
    and K/V); None: it may (the same version, or `wanted` "": a caller that does not say)."""
    if not wanted or held == wanted:
        return None
    return (
        f"node {node} holds version {short(held)} of model {model!r}, not {short(wanted)}: "
        "a stage of another version would run on garbage hidden states"
    )


@dataclass(frozen=True)
class RestoreDecision:
    """What a restored deployment records and says about its version."""

    digest: str
    """The version it serves and records: the model store's now."""
    warning: str = ""
    """One WARNING to log ("" none): the model was replaced while no controller ran."""


def decide_restore(name: str, recorded: str, current: str) -> RestoreDecision:
    """A deployment `name` restored after a controller restart: it recorded version
    `recorded` ("" none: a state file from before versions were recorded, migrated with one
    WARNING of its own), the model store holds `current` now. The store's version is served
    (what a restart of `surge serve` on a replaced model is for, docs/control.md Versions);
    the agents' copies of another version are dropped (`other_versions`)."""
    if not recorded or recorded == current:
        return RestoreDecision(current)
    return RestoreDecision(
        current,
        f"deployment {name!r} served version {short(recorded)} before the restart; its model "
        f"store holds version {short(current)} now (replaced while no controller ran): "
        f"serving {short(current)}, the agents' copies of {short(recorded)} dropped",
    )
