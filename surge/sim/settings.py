"""Settings of one simulation run, validated once.

In: values from the CLI or a benchmark. Out: a frozen `SimSettings` the simulator reads.
"""

from dataclasses import dataclass, field

from surge.errors import SurgeError
from surge.policy.placement import KV_MEMORY_FRACTION
from surge.policy.slo import Slo
from surge.sim.hardware import ClusterProfile

BLOCK_COUNTS = ("system", "elbow")
"""How a simulation picks B, the blocks of each multicast (`SimSettings.block_count`)."""


def check_block_count(value: str) -> None:
    """Refuse a `block_count` that is not one of `BLOCK_COUNTS` (the CLI checks it with this
    before it loads a trace)."""
    if value not in BLOCK_COUNTS:
        raise SurgeError(f"--block-count must be one of {', '.join(BLOCK_COUNTS)} (got {value!r})")


@dataclass(frozen=True)
class SimSettings:
    """One run: which cluster, models and system, and the serving limits."""

    cluster: str | ClusterProfile
    """Cluster preset name or JSON file (`surge.sim.hardware.load_cluster`), or a built
    profile (a scenario's cluster with its overrides, `surge.sim.scenario`)."""
    models: tuple[str, ...]
    """Model names; request with model index i uses models[i % len(models)]. A name may
    be `NAME*N` for N distinct models of one profile (multi-model clusters)."""
    system: str
    """System name (`surge.policy.systems.SYSTEMS`)."""
    seed: int = 0
    """Seed of every random choice in the run."""
    slo: Slo = field(default_factory=Slo)
    """SLO of every model (per-model overrides in `model_slos`)."""
    model_slos: tuple[tuple[str, Slo], ...] = ()
    """(model name, SLO) overrides."""
    max_batch: int = 64
    """Most sequences an instance runs at once."""
    max_prefill_tokens: int = 8192
    """Most prompt tokens in one prefill step."""
    kv_memory_fraction: float = KV_MEMORY_FRACTION
    """Fraction of GPU memory usable by weights + KV cache."""
    sample_interval_s: float = 1.0
    """Period of the GPU / host-cache samplers."""
    max_drain_s: float = 3600.0
    """After the last arrival, stop at most this long later (unfinished are counted)."""
    warm_instances: int = 0
    """Instances of each model serving at time 0 (0 = cold start)."""
    pipeline_micro_batches: int | None = None
    """Micro-batches an execution pipeline (λScale's, ParaServe's groups) keeps in flight.
    None (the default, the paper systems): one per stage, each stage working on a
    different batch (λScale §4.3 Fig. 6a "2D execution pipelines"; the same rule as
    FlexPipe §7 Eq. 12, `policy.flexpipe.microbatch.pipeline_micro_batches`), so a
    g-stage pipeline holds g x `max_batch` sequences and serves at the sum of its stages'
    rates. An int m: this runtime's `PipelineEndpoint` (2 micro-batch groups), modelled
    as a batch limit of m x `max_batch` stepping through every layer at once (no
    micro-batch schedule), as `benchmarks/sim_calibrate` measures it."""
    pipeline_speed: float = 1.0
    """Serving speed of an execution pipeline relative to its cost model (one batch of
    `pipeline_micro_batches` x `max_batch` at an instance's step cost plus a hop per stage
    boundary). 1.0: the model as is (the paper systems). ParaServe's scale-down study sets
    it from its workers' GPU quotas (`benchmarks/paper/paraserve/paraserve_eval.py`); the CPU
    testbed's is measured by `benchmarks/sim_calibrate/pipeline.py`."""
    fractional_gpus: bool = True
    """ParaServe's low-memory workers hold 1/s of one GPU (memory and compute quota,
    §4.1.1-§4.1.2, `policy.paraserve.gpu_share`) and share GPUs with other such workers;
    False: every pipeline worker holds whole GPUs (the model before issue 18's fix).
    Systems without low-memory workers are unaffected either way."""

    model_replicas: tuple[tuple[str, int], ...] = ()
    """(model name, groups) held fixed from time 0 to the end: that model's pool asks for
    exactly this many instances (or FlexPipe groups) at every decision, so the cluster is
    split among the models once, as an offline-configured system places them (AlpaServe's
    placement, the static baseline of FlexPipe §9: "configures pipelines based on
    historical request patterns"). Models not named autoscale as the system does."""

    model_names: tuple[str, ...] = ()
    """Distinct names of the expanded models (a scenario's `code/0`, `code/1`, ...);
    empty: `NAME` or `NAME#i` (`simulator.expand_models`)."""

    block_count: str = "system"
    """B of each multicast: `system` (`SystemConfig.num_blocks`) or `elbow`
    (`surge.policy.multicast.block_count.choose_block_count`: λScale §4.2's selective block size,
    the fewest blocks within 5% of the fastest, per model, N and K)."""
    block_overhead_s: float = 0.0
    """With `elbow`: fixed cost of one block transfer the elbow weighs against smaller
    blocks (what makes many blocks costly)."""

    def __post_init__(self) -> None:
        check_block_count(self.block_count)
        if self.block_overhead_s < 0:
            raise SurgeError("block_overhead_s must be >= 0")
        if not self.models:
            raise SurgeError("give at least one --model")
        if self.max_batch < 1 or self.max_prefill_tokens < 1:
            raise SurgeError("max_batch and max_prefill_tokens must be >= 1")
        if not 0 < self.kv_memory_fraction <= 1:
            raise SurgeError("kv_memory_fraction must be in (0, 1]")
        if not self.sample_interval_s > 0 or not self.max_drain_s > 0:
            raise SurgeError("sample interval and drain limit must be > 0 s")
        if self.warm_instances < 0:
            raise SurgeError("warm_instances must be >= 0")
        if self.pipeline_micro_batches is not None and self.pipeline_micro_batches < 1:
            raise SurgeError("pipeline_micro_batches must be >= 1 or None")
        if not self.pipeline_speed > 0:
            raise SurgeError("pipeline_speed must be > 0")
        names = [name for name, _ in self.model_replicas]
        if len(set(names)) != len(names) or any(n < 1 for _, n in self.model_replicas):
            raise SurgeError("model_replicas: name each model once, with >= 1 groups")

    def slo_of(self, model: str) -> Slo:
        """The SLO of `model`."""
        for name, slo in self.model_slos:
            if name == model:
                return slo
        return self.slo
