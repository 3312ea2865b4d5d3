"""Settings of one simulation run, validated once.

In: values from the CLI or a benchmark. Out: a frozen `SimSettings` the simulator reads.
"""

from dataclasses import dataclass, field

from surge.errors import SurgeError
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
    kv_memory_fraction: float = 0.9
    """Fraction of GPU memory usable by weights + KV cache."""
    sample_interval_s: float = 1.0
    """Period of the GPU / host-cache samplers."""
    max_drain_s: float = 3600.0
    """After the last arrival, stop at most this long later (unfinished are counted)."""
    warm_instances: int = 0
    """Instances of each model serving at time 0 (0 = cold start)."""
    shared_cores: float | None = None
    """Host compute sharing: every instance and execution pipeline of the cluster runs on
    ONE host with this many cores (e.g. local agents on one machine, one thread each).
    Busy endpoints share them equally, each getting at most one core: with n busy, each
    runs at min(1, shared_cores / n) of its cost model's speed. None: every GPU computes
    on its own (a real cluster)."""
    transfer_cores: float = 0.0
    """With `shared_cores`: cores one multicast block transfer in flight takes from that
    host (framing, receive, crc32 verify; sender and receiver together). Every consumer
    then runs at min(1, shared_cores / (busy endpoints + transfer_cores * transfers)) of
    its speed: endpoints' steps and every flow on the network alike."""
    transfers_first: bool = False
    """With `shared_cores`: block transfers take their CPU ahead of serving instead of an
    equal share: flows run at min(1, shared_cores / (transfer_cores * transfers)) and the
    busy endpoints share what is left. Why: the agents that move blocks are I/O-bound (they
    sleep on sockets and wake for each chunk), and Linux's scheduler runs a task waking from
    I/O ahead of CPU-bound ones; measured, the runtime's multicast barely slows while hot
    instances serve (`benchmarks/sim_calibrate/main.py`, fix 8). False: one equal share for all."""
    serving_transfers_shared: bool = False
    """With `transfers_first`: at a node whose agent also serves (a busy endpoint on its
    GPU) a block's CPU work runs at that endpoint's share, so its NIC links move blocks at
    1 / (1 + e * (1/share - 1)), e the cores that end's work takes at full rate
    (`send_cpu_cores` out, `transfer_cores - send_cpu_cores` in):
    `sim/compute_sharing.py`, `benchmarks/sim_calibrate/main.py` fix 9. False: every transfer
    goes first."""
    send_cpu_cores: float = 0.0
    """Of `transfer_cores`, the cores the SENDER's agent spends per block transfer at the
    link's full rate (measured: `benchmarks/sim_calibrate/send.py`, CPU seconds per GB
    sent x the link's GB/s); used by `serving_transfers_shared`."""
    serving_receive_slowdown: float = 0.0
    """With `serving_transfers_shared`: how many times longer a block takes to land in an
    agent that serves than in one that does not, MEASURED (`benchmarks/sim_calibrate/receive.py`:
    the same blocks into a serving and an idle agent at once, while hot instances saturate
    the host); a serving node's ingress links then move at 1 / this of their rate instead of
    the share formula's receiver end (`sim/compute_sharing.py`, calibration fix 11).
    0 (the default): the share formula. Otherwise at least 1."""
    transfer_wakeups: bool = False
    """With `transfers_first`: the transfers' CPU comes as short wake-ups that each hold a
    whole core while they run (ahead of serving), so the busy endpoints get the cores those
    wake-ups leave at each instant (an M/M/c queue's idle servers: `sim/compute_sharing.py`
    `wakeup_share`), not the fluid `cores - transfer demand`. Differs only while fewer
    endpoints are busy than there are cores: a lone hot source loses part of its core even
    though the host has idle capacity (measured: `benchmarks/sim_calibrate/serving.py`,
    calibration fix 12). False: the fluid share."""
    transfer_wakeups_queue: bool = False
    """With `transfer_wakeups`: when the busy endpoints (one serving thread's core each; a
    pipeline counts once) and the transfers' CPU want more cores than the host has, the
    transfers' wake-ups no longer find a core at once: they wait in the run queue beside
    the serving threads (processor sharing among everything runnable, share = cores /
    (busy endpoints + transfer CPU)), so each block's CPU work at its ends takes 1/share
    as long and every flow moves at 1 / (1 + transfer_cores x (1/share - 1)) of its rate
    (`sim/compute_sharing.py` `queued_flow_speed`; checked by
    `benchmarks/sim_calibrate/wakeup_queue.py`, calibration fix 15). False: the wake-ups never
    wait for serving threads."""
    serving_efficiency_in_transfers: float = 1.0
    """With `shared_cores`: while any block transfer is in flight on the host, every busy
    endpoint serves at this fraction of its share (its steps take more CPU each while the
    host moves blocks). Measured: the hot agent's tokens per CPU-second of its engine
    threads during a multicast over alone (`benchmarks/sim_calibrate/serving.py`,
    calibration fix 14). 1.0 (the default): no loss."""
    send_cost_s_per_gb: float = 0.0
    """With `shared_cores`: seconds of serving one GB a node SENDS in a multicast costs
    the endpoints on that node. While a node sends at B GB/s, its endpoints (and any
    execution pipeline with a stage on it) serve at (1 - send_cost_s_per_gb * B) of their
    share (`sim/compute_sharing.py`). 0 (the default): sending costs serving nothing (the
    paper systems, whose GPUs serve while the NIC sends). In this runtime a source's agent
    sends the blocks from the process that serves; `benchmarks/sim_calibrate/send.py`
    measures the serving rate lost per GB/s sent (`sim_calibration.json`, `send_cost`:
    0.86 on Nov 23 21:10, about the sending CPU, ~1 CPU-second per GB)."""
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
    boundary). 1.0: the model as is (the paper systems). This runtime's is measured by
    `benchmarks/sim_calibrate/pipeline.py`: its pipeline's throughput relative to a local
    instance on the same burst, divided by the model's (`sim_calibration.json`,
    `pipeline_serving`)."""
    endpoint_open_s: float = 0.0
    """Seconds (cores free) the controller takes to open one local instance once its node
    holds the model: the runtime's `InstanceOpenOp` and the dispatch of its first requests
    (`runtime/scaleout/local.open_local`). A multicast's openings run one after another,
    as the runtime's carrier awaits each (`sim/carrier.py`); with `shared_cores` each
    stretches by the processor share. 0 (the default): the paper systems' controllers,
    whose start-up cost is `SystemConfig.init_s`; this runtime's value on this machine is
    measured by `benchmarks/sim_calibrate/main.py` (`sim_calibration.json`,
    `endpoint_open.endpoint_open_s`)."""
    pipeline_open_s: float = 0.0
    """As `endpoint_open_s`, for one execution pipeline (one `StageOpenOp` per stage, its
    head engines, its first dispatch: `PipelineEndpoint.open` + `add_endpoint`)."""

    fractional_gpus: bool = True
    """ParaServe's low-memory workers hold 1/s of one GPU (memory and compute quota,
    §4.1.1-§4.1.2, `policy.paraserve_gpu_share`) and share GPUs with other such workers;
    False: every pipeline worker holds whole GPUs (the model before issue 18's fix).
    Systems without low-memory workers are unaffected either way."""

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
        if self.shared_cores is not None and not self.shared_cores > 0:
            raise SurgeError("shared_cores must be > 0 or None")
        if self.transfer_cores < 0 or (
            self.pipeline_micro_batches is not None and self.pipeline_micro_batches < 1
        ):
            raise SurgeError("transfer_cores must be >= 0, pipeline_micro_batches >= 1 or None")
        if self.transfers_first and self.shared_cores is None:
            raise SurgeError("transfers_first needs shared_cores (one host's cores)")
        if not 0 <= self.send_cpu_cores <= max(self.transfer_cores, 0.0):
            raise SurgeError("send_cpu_cores must be between 0 and transfer_cores")
        if self.serving_transfers_shared and not self.transfers_first:
            raise SurgeError("serving_transfers_shared needs transfers_first")
        if self.serving_receive_slowdown != 0 and not self.serving_receive_slowdown >= 1:
            raise SurgeError("serving_receive_slowdown must be 0 (off) or >= 1")
        if self.serving_receive_slowdown and not self.serving_transfers_shared:
            raise SurgeError("serving_receive_slowdown needs serving_transfers_shared")
        if not 0 < self.serving_efficiency_in_transfers <= 1:
            raise SurgeError("serving_efficiency_in_transfers must be in (0, 1]")
        if self.serving_efficiency_in_transfers < 1 and self.shared_cores is None:
            raise SurgeError("serving_efficiency_in_transfers needs shared_cores")
        if self.transfer_wakeups and not self.transfers_first:
            raise SurgeError("transfer_wakeups needs transfers_first")
        if self.transfer_wakeups_queue and not self.transfer_wakeups:
            raise SurgeError("transfer_wakeups_queue needs transfer_wakeups")
        if self.send_cost_s_per_gb < 0:
            raise SurgeError("send_cost_s_per_gb must be >= 0")
        if self.send_cost_s_per_gb > 0 and self.shared_cores is None:
            raise SurgeError("send_cost_s_per_gb needs shared_cores (one host's cores)")
        if not self.pipeline_speed > 0:
            raise SurgeError("pipeline_speed must be > 0")
        if self.endpoint_open_s < 0 or self.pipeline_open_s < 0:
            raise SurgeError("endpoint_open_s and pipeline_open_s must be >= 0")

    def slo_of(self, model: str) -> Slo:
        """The SLO of `model`."""
        for name, slo in self.model_slos:
            if name == model:
                return slo
        return self.slo
