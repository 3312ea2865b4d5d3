"""Which instances a restarted controller adopts, and what it closes.

A new controller on agents that outlived the old one (a crash, `surge serve` restarted against
the same state directory) finds what the old one left running: local instances with their
weights on the device, pipeline stages, device copies with no instance (a scale-out under
way), copies of models it no longer deploys or of another version. Reloading what is already
loaded wastes the start-up the system exists to make fast, so what can serve again is adopted:
it becomes its deployment's instance once more, with no load. The rest is closed, each with
its reason (one log line each, `control/adoption.py`).

In: what each live agent reports (`NodeReport`: per model, the digest of the manifest it runs
it with and its blocks on the device; its running instances and stages), the deployments the
controller restores (`Restored`: the digest of its store, its block count, the name it gives
its instance on each node, its most instances) and the slots per node. Out: typed actions.
Rules, per node and model:
- a model no restored deployment names: its instances and stages close (`Close`) and its
  device copy goes (`Release`); its host and disk copies stay (what a later deployment of it
  may start from);
- another version (the agent's digest is not the store's): the model is dropped on the node
  (`Drop`: instances, stages and every copy in every tier: a host copy of the old weights
  is no warm start of the new);
- a pipeline stage: closed; its pipeline's other stages and its routing ended with the old
  controller (FlexPipe's and λScale's pipelines start again from the copies that stay);
- a local instance under another name than this controller gives its instance there: closed;
- a local instance whose weights are not all on the device (half-loaded): released (closed,
  device copy evicted, host and disk copies kept: a warm start);
- a device copy with no instance (a scale-out under way): released;
- a whole local instance of the right version: adopted (`Adopt`), lowest node first, while
  the deployment holds fewer than its most instances and the node has a free slot; else
  released.
Pure and deterministic: no I/O, no clock.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from surge.errors import SurgeError

RunningKind = Literal["instance", "stage"]


@dataclass(frozen=True)
class Running:
    """A local instance or a pipeline stage an agent reports running."""

    name: str
    model: str
    kind: RunningKind
    req_ids: tuple[str, ...] = ()
    """The old controller's requests it holds (an adopted instance has them aborted)."""


@dataclass(frozen=True)
class HeldModel:
    """One model as an agent holds it."""

    digest: str
    """The digest of the manifest the agent runs it with (`Manifest.digest`)."""
    gpu_blocks: int
    """Its blocks whose copy on the device is whole."""


@dataclass(frozen=True)
class NodeReport:
    """What one live agent holds (its `status`)."""

    node: int
    models: Mapping[str, HeldModel] = field(default_factory=dict)
    running: tuple[Running, ...] = ()


@dataclass(frozen=True)
class Restored:
    """A deployment the restarted controller brings back."""

    digest: str
    """Its store's manifest digest."""
    num_blocks: int
    instance_names: Mapping[int, str]
    """The name this controller gives the deployment's local instance on each node."""
    max_instances: int
    """Most instances it may hold (`max_replicas` within the cluster)."""

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.max_instances < 0:
            raise SurgeError("a restored deployment needs num_blocks >= 1, max_instances >= 0")


@dataclass(frozen=True)
class Adopt:
    """The instance serves its deployment again, with no load."""

    model: str
    node: int
    instance: str
    req_ids: tuple[str, ...] = ()
    """The old controller's requests on it, to abort (their clients are gone)."""


@dataclass(frozen=True)
class Close:
    """Close one instance or pipeline stage; the model's copies stay."""

    model: str
    node: int
    name: str
    kind: RunningKind
    reason: str


@dataclass(frozen=True)
class Release:
    """Close the model's instance on the node, if any, and evict its device copy (host and
    disk copies stay: warm starts)."""

    model: str
    node: int
    reason: str


@dataclass(frozen=True)
class Drop:
    """Forget the model on the node: its instances, stages and copies in every tier."""

    model: str
    node: int
    reason: str


Action = Adopt | Close | Release | Drop


def plan(
    reports: tuple[NodeReport, ...],
    restored: Mapping[str, Restored],
    slots_per_node: int,
) -> tuple[Action, ...]:
    """What to adopt and what to close of everything the agents report (module docstring).
    Actions are in node order, then model order."""
    actions: list[Action] = []
    adopted: dict[str, int] = {}
    for report in sorted(reports, key=lambda r: r.node):
        free = slots_per_node
        models = sorted(set(report.models) | {r.model for r in report.running})
        for model in models:
            running = tuple(r for r in report.running if r.model == model)
            held = report.models.get(model)
            dep = restored.get(model)
            node_actions = _one_model(report.node, model, held, running, dep, adopted, free)
            free -= sum(isinstance(a, Adopt) for a in node_actions)
            actions += node_actions
    return tuple(actions)


def _one_model(
    node: int,
    model: str,
    held: HeldModel | None,
    running: tuple[Running, ...],
    dep: Restored | None,
    adopted: dict[str, int],
    free_slots: int,
) -> list[Action]:
    on_gpu = held is not None and held.gpu_blocks > 0
    if dep is None:
        why = f"no deployment named {model!r} is restored"
        out: list[Action] = [Close(model, node, r.name, r.kind, why) for r in running]
        return out + ([Release(model, node, why)] if on_gpu else [])
    if held is not None and held.digest != dep.digest:
        why = (
            f"it runs another version of the model ({held.digest[:19]}, the store's is "
            f"{dep.digest[:19]})"
        )
        return [Drop(model, node, why)]
    out = []
    candidate: Running | None = None
    for r in running:
        if r.kind == "stage":
            why = "a pipeline stage: its pipeline ended with the old controller"
            out.append(Close(model, node, r.name, r.kind, why))
        elif r.name != dep.instance_names.get(node) or candidate is not None:
            why = f"not the instance this controller names {dep.instance_names.get(node)!r}"
            out.append(Close(model, node, r.name, r.kind, why))
        else:
            candidate = r
    whole = held is not None and held.gpu_blocks >= dep.num_blocks
    if candidate is None:
        if on_gpu:
            out.append(Release(model, node, "a device copy with no instance (a load under way)"))
        return out
    if not whole:
        out.append(Release(model, node, "half-loaded: not every block is on the device"))
    elif adopted.get(model, 0) >= dep.max_instances:
        out.append(Release(model, node, f"the deployment holds at most {dep.max_instances}"))
    elif free_slots < 1:
        out.append(Release(model, node, "the node has no free slot"))
    else:
        adopted[model] = adopted.get(model, 0) + 1
        out.append(Adopt(model, node, candidate.name, candidate.req_ids))
    return out


def adopted_idle_since_s(quiet_since_s: float | None, now_s: float) -> float:
    """Since when an adopted instance counts as idle (its keep-alive and downscale delay run
    from then): the restart's carried quiet time for it (`policy.autoscale_restart.Restart.
    quiet_of`: its last request, as the old controller last wrote it), not the restart; with no
    carry (a first start, an unreadable state file) the restart itself, the only time known."""
    return now_s if quiet_since_s is None else min(quiet_since_s, now_s)
