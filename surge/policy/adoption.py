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
controller restores (`Restored`: the digest of its store, its block count and their layers,
the name it gives its instance on each node, its most instances) and the slots per node.
Out: typed actions.
Rules, per node and model:
- a model no restored deployment names: its instances and stages close (`Close`) and its
  device copy goes (`Release`); its host and disk copies stay (what a later deployment of it
  may start from);
- another version (the agent's digest is not the store's): the model is dropped on the node
  (`Drop`: instances, stages and every copy in every tier: a host copy of the old weights
  is no warm start of the new);
- a pipeline (λScale's execution pipelines, ParaServe's groups, FlexPipe's pipelines: the
  stages of one name on one or more nodes): adopted whole (`AdoptPipeline`, one serving
  instance over its stages' nodes) when `policy.pipeline_adoption.chain` finds every stage
  of the store's version, end to end, none half-loaded, while the deployment holds fewer
  than its most instances, every member node has a free slot and runs no local instance of
  the model (one instance per node and deployment); else each stage is closed with the
  reason and a member's device copy is released (no instance: a warm start from its host
  copy);
- a local instance under another name than this controller gives its instance there: closed;
- a local instance whose weights are not all on the device (half-loaded): released (closed,
  device copy evicted, host and disk copies kept: a warm start);
- a device copy with no instance (a scale-out under way): released;
- a whole local instance of the right version: adopted (`Adopt`), lowest node first, while
  the deployment holds fewer than its most instances and the node has a free slot; else
  released.
Local instances are decided first (a whole model on one node serves with no hop), then
pipelines, by name, with the slots and instances left.
Pure and deterministic: no I/O, no clock.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from surge.errors import SurgeError
from surge.policy.pipeline_adoption import Layout, SeenStage, Stages, chain

RunningKind = Literal["instance", "stage"]


@dataclass(frozen=True)
class Running:
    """A local instance or a pipeline stage an agent reports running."""

    name: str
    model: str
    kind: RunningKind
    req_ids: tuple[str, ...] = ()
    """The old controller's requests it holds (an adopted instance has them aborted)."""
    first_layer: int = 0
    end_layer: int = 0
    """A stage's layers [first_layer, end_layer)."""
    next_node: int | None = None
    """The node a stage hands on to (None: the last)."""
    compute_group: str | None = None
    seq_ids: tuple[int, ...] = ()
    """The sequences a stage holds K/V of (an adopted pipeline has them freed)."""


@dataclass(frozen=True)
class HeldModel:
    """One model as an agent holds it."""

    digest: str
    """The digest of the manifest the agent runs it with (`Manifest.digest`)."""
    gpu: frozenset[int]
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
    block_layers: tuple[tuple[int, int], ...] = ()
    """Each block's [first_layer, end_layer) (`Layout`); empty: no pipeline is adopted."""

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.max_instances < 0:
            raise SurgeError("a restored deployment needs num_blocks >= 1, max_instances >= 0")
        if self.block_layers and len(self.block_layers) != self.num_blocks:
            raise SurgeError("a restored deployment's block_layers needs one entry per block")


@dataclass(frozen=True)
class Adopt:
    """The instance serves its deployment again, with no load."""

    model: str
    node: int
    instance: str
    req_ids: tuple[str, ...] = ()
    """The old controller's requests on it, to abort (their clients are gone)."""


@dataclass(frozen=True)
class AdoptPipeline:
    """The pipeline serves its deployment again as one instance, with no load."""

    model: str
    name: str
    """Its stages' name on the agents (`StageOpenOp.pipeline`)."""
    stages: Stages
    """(node, first_layer, end_layer) in the order they hand on."""
    seq_ids: tuple[int, ...] = ()
    """The old head engines' sequences its stages hold K/V of, to free."""

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(n for n, _, _ in self.stages)


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


Action = Adopt | AdoptPipeline | Close | Release | Drop


def plan(
    reports: tuple[NodeReport, ...],
    restored: Mapping[str, Restored],
    slots_per_node: int,
) -> tuple[Action, ...]:
    """What to adopt and what to close of everything the agents report (module docstring).
    Local instances' actions first, in node order, then model order; then pipelines', by
    model and name; then the device copies their closed stages leave."""
    actions: list[Action] = []
    adopted: dict[str, int] = {}
    free = {r.node: slots_per_node for r in reports}
    deferred: set[tuple[str, int]] = set()
    """(model, node): a device copy with no local instance but stages: pipelines decide."""
    for report in sorted(reports, key=lambda r: r.node):
        models = sorted(set(report.models) | {r.model for r in report.running})
        for model in models:
            running = tuple(r for r in report.running if r.model == model)
            held = report.models.get(model)
            dep = restored.get(model)
            node_actions = _one_model(
                report.node, model, held, running, dep, adopted, free[report.node], deferred
            )
            free[report.node] -= sum(isinstance(a, Adopt) for a in node_actions)
            actions += node_actions
    return tuple(actions + _pipelines(reports, restored, adopted, free, deferred))


def _one_model(
    node: int,
    model: str,
    held: HeldModel | None,
    running: tuple[Running, ...],
    dep: Restored | None,
    adopted: dict[str, int],
    free_slots: int,
    deferred: set[tuple[str, int]],
) -> list[Action]:
    on_gpu = held is not None and bool(held.gpu)
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
            continue  # its pipeline is decided whole (`_pipelines`)
        if r.name != dep.instance_names.get(node) or candidate is not None:
            why = f"not the instance this controller names {dep.instance_names.get(node)!r}"
            out.append(Close(model, node, r.name, r.kind, why))
        else:
            candidate = r
    whole = held is not None and len(held.gpu) >= dep.num_blocks
    if candidate is None:
        if on_gpu and any(r.kind == "stage" for r in running):
            deferred.add((model, node))
        elif on_gpu:
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


def _pipelines(
    reports: tuple[NodeReport, ...],
    restored: Mapping[str, Restored],
    adopted: dict[str, int],
    free: dict[int, int],
    deferred: set[tuple[str, int]],
) -> list[Action]:
    """Each restored deployment's pipelines (its stages by name), adopted whole or closed
    (module docstring); then the deferred device copies no adopted pipeline runs on."""
    held: dict[tuple[str, int], HeldModel] = {}
    local: set[tuple[str, int]] = set()
    """(model, node) running the instance this controller names there."""
    by_name: dict[tuple[str, str], list[tuple[int, Running]]] = {}
    for report in sorted(reports, key=lambda r: r.node):
        held.update({(m, report.node): h for m, h in report.models.items()})
        for r in report.running:
            dep = restored.get(r.model)
            if dep is None:
                continue
            if r.kind == "instance" and r.name == dep.instance_names.get(report.node):
                local.add((r.model, report.node))  # adopted or released: not a stage's
            elif r.kind == "stage":
                by_name.setdefault((r.model, r.name), []).append((report.node, r))
    serving: set[tuple[str, int]] = set()
    out: list[Action] = []
    for (model, name), seen in sorted(by_name.items()):
        dep = restored[model]
        stages = [_seen(n, r, held.get((model, n))) for n, r in seen]
        got = chain(stages, Layout(dep.digest, dep.block_layers))
        if not isinstance(got, str):
            got = _room(model, got, dep, adopted, free, local | serving) or got
        if isinstance(got, str):
            out += [
                Close(model, n, name, "stage", f"a pipeline stage not adopted: {got}")
                for (n, _), s in zip(seen, stages, strict=True)
                if s.digest in ("", dep.digest)  # another version's node is dropped
            ]
            continue
        adopted[model] = adopted.get(model, 0) + 1
        for n, _, _ in got:
            free[n] -= 1
            serving.add((model, n))
        seq_ids = tuple(sorted({i for _, r in seen for i in r.seq_ids}))
        out.append(AdoptPipeline(model, name, got, seq_ids))
    why = "a device copy with no instance (its pipeline's stages closed)"
    return out + [Release(m, n, why) for m, n in sorted(deferred) if (m, n) not in serving]


def _seen(node: int, r: Running, held: HeldModel | None) -> SeenStage:
    digest, gpu = (held.digest, held.gpu) if held is not None else ("", frozenset())
    return SeenStage(node, r.first_layer, r.end_layer, r.next_node, digest, gpu, r.compute_group)


def _room(
    model: str,
    stages: Stages,
    dep: Restored,
    adopted: dict[str, int],
    free: dict[int, int],
    taken: set[tuple[str, int]],
) -> str | None:
    """Why a whole pipeline cannot be adopted (None: it can): the deployment's most
    instances, a member node's slots, or a member node that serves the deployment already
    (its local instance, or another pipeline: one instance per node and deployment)."""
    if adopted.get(model, 0) >= dep.max_instances:
        return f"the deployment holds at most {dep.max_instances}"
    for n, _, _ in stages:
        if (model, n) in taken:
            return f"node {n} serves the deployment otherwise (a local instance or pipeline)"
        if free.get(n, 0) < 1:
            return f"node {n} has no free slot"
    return None


def adopted_idle_since_s(quiet_since_s: float | None, now_s: float) -> float:
    """Since when an adopted instance counts as idle (its keep-alive and downscale delay run
    from then): the restart's carried quiet time for it (`policy.autoscale_restart.Restart.
    quiet_of`: its last request, as the old controller last wrote it), not the restart; with no
    carry (a first start, an unreadable state file) the restart itself, the only time known."""
    return now_s if quiet_since_s is None else min(quiet_since_s, now_s)
