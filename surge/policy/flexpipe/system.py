"""FlexPipe as one system: granularity, partition, placement and refactoring composed.

In: a model's per-layer profile (compute, parameter and activation bytes), its recent
arrival times, free slots (GPUs) and a `FlexPipeSettings`. Out:
- `choose_num_stages`: the number of stages from the arrivals' CV (§6.1 Eq. 4, through
  `granularity.update_granularity`, state passed in and returned), over
  candidates whose throughput and latency come from the layer profile;
- `useful_stages`: the finest stage count worth having (§7 ①): each of m stages loads
  1/m of the model, but every decode step pays m − 1 more hops;
- `scale_out_num_stages`: the stages of a NEW instance (§7 Eq. 11/12): finer when the
  queue is long and the traffic bursty (never finer than `useful_stages`), and fine
  enough to meet the TTFT deadline;
- `stage_layers`: the layers of each stage (§5 Eq. 2, `partition.partition_model`);
- `place_stages`, `place_new_group` (from `flexpipe/stage_placement`): the slot of each stage (§6.2
  Eq. 6), and a new group's slots by §7 Eq. 13's affinity first;
- `refactor`: the layer moves and KV copies that turn the running stages into the chosen
  ones (§6 Fig. 6, Eq. 10, `refactor.plan_refactor`).
The simulator (`surge.sim.flexpipe`) carries these out for systems whose
`SystemConfig.group_sizing` is `flexpipe`. Pure and deterministic.

Candidate profiles are ours: an
η-stage pipeline's latency is the prefill plus η − 1 hops; its throughput is one
micro-batch step per stage step (each stage runs 1/η of the layers, plus one hop).
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from surge.errors import SurgeError
from surge.policy.flexpipe.granularity import (
    GranularityCandidate,
    GranularityState,
    choose_scaling_granularity,
    cv_of_arrivals,
    update_granularity,
)
from surge.policy.flexpipe.hrg import HrgView, group_by_server, hrg_domains
from surge.policy.flexpipe.partition import OperatorProfile, PartitionSettings, partition_model
from surge.policy.flexpipe.refactor import RefactorPlan, RunningRequest, StageSpan, plan_refactor
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.flexpipe.slot_allocation import SlotState, affinity_score
from surge.policy.flexpipe.stage_placement import Affinity, place_new_group, place_stages


@dataclass(frozen=True)
class LayerProfile:
    """The model as FlexPipe profiles it, per layer (all layers alike)."""

    num_layers: int
    """Layers (the blocks FlexPipe cuts at)."""
    prefill_s: float
    """One layer's prefill of a typical prompt (s)."""
    decode_s: float
    """One layer's decode step of a typical batch (s)."""
    param_bytes: int
    """One layer's weights."""
    activation_bytes: int
    """What one layer hands to the next for a typical prompt."""
    hop_s: float
    """One activation hop between stages (s)."""
    layer_prefill_s: tuple[float, ...] = ()
    """Measured prefill time of each layer (§5's t_c, profiled on the node); empty: every
    layer takes `prefill_s`."""

    def __post_init__(self) -> None:
        if self.num_layers < 1 or min(self.prefill_s, self.decode_s, self.hop_s) < 0:
            raise SurgeError("a layer profile needs >= 1 layer and times >= 0")
        if self.layer_prefill_s and len(self.layer_prefill_s) != self.num_layers:
            raise SurgeError("layer_prefill_s needs one time per layer")
        if any(t < 0 for t in self.layer_prefill_s):
            raise SurgeError("layer times must be >= 0")


def candidates(
    profile: LayerProfile, settings: FlexPipeSettings
) -> tuple[GranularityCandidate, ...]:
    """One Eq. 4 candidate per stage count that the layers allow."""
    out = []
    n = profile.num_layers
    for eta, cv in zip(settings.stage_counts, settings.cv_targets, strict=True):
        if eta > n:
            break
        latency = n * profile.prefill_s + (eta - 1) * profile.hop_s
        stage_step = n * profile.decode_s / eta + profile.hop_s
        out.append(GranularityCandidate(eta, 1, 1.0 / stage_step, latency, cv))
    return tuple(out)


def choose_num_stages(
    arrival_times_s: Sequence[float],
    profile: LayerProfile,
    state: GranularityState,
    settings: FlexPipeSettings,
) -> tuple[int, GranularityState]:
    """§6.1: the number of stages for the arrivals' CV, and the controller's new state."""
    cands = candidates(profile, settings)
    new = update_granularity(cands, state, cv_of_arrivals(arrival_times_s), settings.granularity)
    assert new.current is not None
    return cands[new.current].num_stages, new


def useful_stages(
    model_load_s: float,
    hop_s: float,
    decode_steps: float,
    num_layers: int,
    settings: FlexPipeSettings,
) -> int:
    """§7 ①: "fine-grained scaling (stage-level) reduces cold-start time but increases
    communication overhead". The stage count of `stage_counts` (at most `num_layers`) that
    brings a waiting request soonest to its last token: its m stages load 1/m of the model
    each, in parallel (`model_load_s` / m), and each of its `decode_steps` steps then pays
    m − 1 activation hops (`hop_s`). Ties go to the coarser (fewer GPUs). Finer than this,
    the hops cost more than the faster start saves."""
    counts = [c for c in settings.stage_counts if c <= num_layers] or [1]

    def cost(m: int) -> float:
        return model_load_s / m + (m - 1) * hop_s * decode_steps

    return min(counts, key=lambda m: (cost(m), m))


def split_stages(
    eq4_stages: int,
    model_load_s: float,
    profile: LayerProfile,
    decode_steps: float | None,
    settings: FlexPipeSettings,
) -> int:
    """What busy groups split to while requests wait (`group_refactors`): Eq. 4's choice
    for the CV, at most `useful_stages` for requests of `decode_steps` steps
    (`settings.default_decode_steps` when None)."""
    steps = settings.default_decode_steps if decode_steps is None else decode_steps
    useful = useful_stages(model_load_s, profile.hop_s, steps, profile.num_layers, settings)
    return min(eq4_stages, useful)


def scale_out_num_stages(
    arrival_times_s: Sequence[float],
    queue_length: int,
    profile: LayerProfile,
    deadline_s: float,
    model_load_s: float,
    settings: FlexPipeSettings,
    decode_steps: float | None = None,
) -> int:
    """§7: stages of a new instance. Eq. 11 gives m from the arrivals' CV times the
    normalised queue, at most `useful_stages` (for requests of `decode_steps` steps;
    `settings.default_decode_steps` when None); Eq. 12 then raises m until (T − S(m))
    Σ_k μ_k covers the queue within the TTFT deadline T, where S(m) = `model_load_s` / m
    (each of m stages loads 1/m of the model in parallel, §7) and each stage adds μ = 1 /
    (one whole-model prefill) requests/s (a pipeline of m stages keeps m micro-batches in
    flight). Eq. 12's r_j is read as one request per queued one (Σμ (T − S) >= Q): the
    deadline outranks the hops. The result is rounded up to a granularity of
    `stage_counts` (the ones the refactoring moves between). Eq. 4's CV choice shapes the
    serving groups (`group_refactors`), not new ones: a new group starts at the granularity
    that serves its queue soonest, and the loop re-cuts it once it serves."""
    finest = min(max(settings.stage_counts), profile.num_layers)
    steps = settings.default_decode_steps if decode_steps is None else decode_steps
    useful = useful_stages(model_load_s, profile.hop_s, steps, profile.num_layers, settings)
    scaling = settings.scaling
    if scaling.max_granularity > finest:
        scaling = replace(scaling, max_granularity=finest)
    decision = choose_scaling_granularity(
        cv=cv_of_arrivals(arrival_times_s),
        queue_length=queue_length,
        deadline_s=deadline_s,
        fixed_init_s=0.0,
        model_load_s=model_load_s,
        stage_throughput_rps=1.0 / max(profile.num_layers * profile.prefill_s, 1e-9),
        num_requests=1,
        settings=scaling,
        max_start=useful,
    )
    eq4, _ = choose_num_stages(arrival_times_s, profile, GranularityState(), settings)
    wanted = max(decision.num_stages, min(eq4, useful))
    return min((c for c in settings.stage_counts if c >= wanted), default=finest)


def stage_layers(
    profile: LayerProfile,
    num_stages: int,
    bandwidth_gbps: float,
    max_slot_memory_bytes: int,
    settings: FlexPipeSettings,
) -> tuple[tuple[int, int], ...]:
    """§5: layers [start, end) of each stage (Eq. 2's partition)."""
    times = profile.layer_prefill_s or (profile.prefill_s,) * profile.num_layers
    ops = tuple(
        OperatorProfile(t, profile.param_bytes, profile.activation_bytes, i)
        for i, t in enumerate(times)
    )
    part = partition_model(
        ops,
        PartitionSettings(
            num_stages=num_stages,
            bandwidth_gbps=bandwidth_gbps,
            max_slot_memory_bytes=max_slot_memory_bytes,
            boundary_penalty_s=settings.boundary_penalty_s,
        ),
    )
    return part.bounds


def refactor(
    current: Sequence[tuple[int, tuple[int, int]]],
    target: Sequence[tuple[int, tuple[int, int]]],
    valid_tokens: Sequence[tuple[str, int]],
) -> RefactorPlan:
    """§6: moves from `current` to `target` stages, each (slot, (first layer, end layer)),
    for running requests (id, valid KV tokens)."""
    return plan_refactor(
        [StageSpan(s, a, b) for s, (a, b) in current],
        [StageSpan(s, a, b) for s, (a, b) in target],
        [RunningRequest(r, n) for r, n in valid_tokens],
    )


def arrivals_in_window(
    arrival_times_s: Sequence[float], now_s: float, settings: FlexPipeSettings
) -> tuple[float, ...]:
    """The arrivals of the last `cv_window_s` seconds (§6.1's sliding window)."""
    return tuple(t for t in arrival_times_s if now_s - settings.cv_window_s < t <= now_s)


@dataclass(frozen=True)
class StageChoice:
    """The stages of a pipeline: layers [first, end) and slot of each, in stage order."""

    bounds: tuple[tuple[int, int], ...]
    slots: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        return len(self.bounds)


def choose_stages(
    profile: LayerProfile,
    num_stages: int,
    kept_slots: Sequence[int],
    free_slots: Sequence[SlotState],
    cv: float,
    bandwidth_gbps: float,
    max_slot_memory_bytes: int,
    settings: FlexPipeSettings,
    affinity: Affinity | None = None,
    hrg: HrgView | None = None,
) -> StageChoice | None:
    """The layers (§5 Eq. 2) and slots (§6.2 Eq. 6) of a `num_stages` pipeline. The first
    stages stay on `kept_slots` (the pipeline's slots now, in stage order: a refactoring
    moves as little as it can), the others go where `place_stages` puts them among
    `free_slots`, or for a new pipeline with `affinity`, where `place_new_group` does
    (§7 Eq. 13: the model's recent hosts first). With `hrg` (§7's Hierarchical Resource
    Graph, `flexpipe/hrg.py`) they are placed inside the narrowest part of the hierarchy
    that takes them all (one server, then one rack, the fewest servers), stages of one
    server adjacent.
    When the free slots cannot take them, the next coarser granularity of
    `settings.stage_counts` is tried (fewer stages than wanted beats none). A new pipeline
    (no `kept_slots`) whose model no cut that coarse fits (§5 Eq. 2: every stage within
    one GPU's memory, `max_slot_memory_bytes`) then tries the finer granularities of
    `stage_counts`, fewest stages first: FlexPipe serves a model too large for the
    granularity asked at the next one that holds it, rather than not at all. None if none
    fits."""
    counts = [c for c in settings.stage_counts if c <= min(num_stages, profile.num_layers)]
    order = sorted(set(counts) | {1}, reverse=True)
    if not kept_slots:
        order += sorted(
            c for c in set(settings.stage_counts) if num_stages < c <= profile.num_layers
        )
    for eta in order:
        try:
            bounds = stage_layers(profile, eta, bandwidth_gbps, max_slot_memory_bytes, settings)
        except SurgeError:
            continue  # a stage of this size fits no slot
        kept = tuple(kept_slots[:eta])
        extra = [(b - a) * profile.param_bytes for a, b in bounds[len(kept) :]]
        if not extra:
            return StageChoice(bounds, kept)
        throughput = 1.0 / max(profile.decode_s * profile.num_layers / eta, 1e-9)
        free = [f for f in free_slots if f.slot_id not in kept]
        placed = _place_extra(extra, throughput, cv, kept, free, settings, affinity, hrg)
        if placed is not None:
            return StageChoice(bounds, kept + placed)
    return None


def _place_extra(
    extra: list[int],
    throughput: float,
    cv: float,
    kept: tuple[int, ...],
    free: list[SlotState],
    settings: FlexPipeSettings,
    affinity: Affinity | None,
    hrg: HrgView | None,
) -> tuple[int, ...] | None:
    """The slots of the stages past `kept`: Eq. 6 (or Eq. 13 then Eq. 6) inside each of
    the HRG's candidate domains in turn, or over every free slot without an HRG."""
    if hrg is not None and affinity is not None:  # Eq. 13's score ranks past hosts
        counts = {
            h: sum(1 for f in free if hrg.server_of[f.slot_id] == h) for h in hrg.server_of.values()
        }
        scores = {
            r.server_id: affinity_score(
                r, counts.get(r.server_id, 0), affinity.now_s, settings.affinity
            )
            for r in affinity.history
        }
        hrg = replace(hrg, past_hosts=scores)
    domains = [[f.slot_id for f in free]]
    if hrg is not None:
        domains = [list(d) for d in hrg_domains(kept, domains[0], len(extra), hrg, settings.hrg)]
    by_id = {f.slot_id: f for f in free}
    for domain in domains:
        slots = [by_id[s] for s in domain]
        if affinity is None:
            placed = place_stages("pipeline", extra, throughput, cv, slots, settings)
        else:
            placed = place_new_group(
                "pipeline", extra, throughput, cv, slots, affinity.server_of, affinity.history,
                affinity.now_s, settings,
            )  # fmt: skip
        if placed is None:
            continue
        if hrg is None:
            return placed
        alike = {(by_id[s].free_memory_bytes, by_id[s].resident_models) for s in placed}
        return group_by_server(kept, placed, hrg, len(alike) == 1)
    return None
