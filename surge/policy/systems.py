"""Systems as data: λScale, BlitzScale, ParaServe, FlexPipe, ServerlessLLM and baselines.

In: a system name (a deployment's `strategy` in `surge serve`, `--system` in
`surge simulate`: the same names). Out: a `SystemConfig`, one choice per decision point:
where a new instance's weights come from (`load`, decided per destination by
`surge.policy.startup`), which multicast plan (`surge.policy.multicast.scale_out` strategy), how
it serves while loading (`surge.policy.loading`: execution pipelines, BlitzScale live
scaling, or load-then-serve), ParaServe's group sizing (Alg. 1) and consolidation
(§6.1 predictor), how the host cache behaves (`surge.policy.copies.keepalive`), the
autoscaler's settings (`surge.policy.autoscale_settings`), and P/D disaggregation. No system
has code of its own in the runtime or the simulator: both read these fields.
"""

from dataclasses import dataclass, field, replace

from surge.errors import SurgeError
from surge.policy.autoscale_settings import AutoscaleSettings
from surge.policy.blitzscale.pd import PdSettings
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.router import ROUTINGS

LOADS = ("multicast", "local", "allcache", "registry-parallel", "ideal")
SERVE_WHILE_LOADING = ("none", "pipelines", "live")
HOST_CACHES = ("lru", "pinned-one", "pinned-lru", "all", "none")
COLD_FALLBACKS = ("host-then-multicast", "local")
MULTICAST_TRANSPORTS = ("blocks", "gloo", "gloo-ring")
GROUP_SIZINGS = ("fixed", "alg1", "flexpipe")
CONSOLIDATIONS = ("none", "scale-up", "predictor")
ALIASES = {"load-then-serve": "serverlessllm"}
"""Older names still accepted (deployments stored before the names were unified)."""


@dataclass(frozen=True)
class SystemConfig:
    """One system = one choice per decision point. Validated at construction."""

    name: str
    """System name as given to --system."""
    load: str
    """Where new weights come from: `multicast` (GPU peers by a plan), `local` (own host
    cache on a hit, else SSD/registry), `allcache` (host memory, always a hit),
    `registry-parallel` (ParaServe: a pipeline group fetches disjoint parts in
    parallel), `ideal` (zero load time)."""
    multicast_strategy: str = "binomial"
    """`surge.policy.multicast.scale_out` strategy for `multicast` loads."""
    num_blocks: int = 16
    """Blocks a model is cut into for multicast (λScale Fig. 18: 16 is the sweet spot)."""
    max_sources: int = 1
    """k: most GPU copies a multicast sends from (λScale k-way, §4.2)."""
    serve_while_loading: str = "none"
    """`none` (load-then-serve), `pipelines` (λScale execution pipelines §4.3), `live`
    (BlitzScale §4, §5.2 layer-level cooperative execution: once `live_start_fraction` of
    its blocks are in, a target runs the first layers of queued batches and an
    overloaded instance the rest, on the zigzag schedule; alone once complete)."""
    live_start_fraction: float = 0.5
    """Fraction of blocks after which a `live` target starts serving."""
    group_setup_s: float = 0.0
    """Fixed cost before each multicast (NCCL's communicator creation:
    `NCCL_GROUP_SETUP_S`). The simulator waits it; the runtime waits it with the `blocks`
    transport, and with `gloo`/`gloo-ring` creates a real group and pays what that takes,
    padded under GPU-time emulation to last at least this long on the serving clock (a
    CPU group on one host is not the emulated GPU cluster's communicator)."""
    multicast_transport: str = "blocks"
    """How a `multicast` load's bytes move in the runtime: `blocks` (surge's own block
    pulls, in the plan's order), `gloo` (the NCCL baseline on CPU hosts: a real
    `torch.distributed` gloo process group among the first source and the targets,
    created per scale-out, gloo's broadcast collective per block; `runtime/collective.py`)
    or `gloo-ring` (the same group moving the blocks in NCCL's ring order: a
    block-pipelined chain over gloo's send/recv). The simulator models both as the plan
    plus `group_setup_s`."""
    cold_fallback: str = "host-then-multicast"
    """With no GPU copy: `host-then-multicast` (one target loads from the host copy or
    the store, then multicasts) or `local` (every target loads locally)."""
    host_cache: str = "lru"
    """`lru` (keep-alive + LRU, ServerlessLLM), `pinned-one` (BlitzScale O(1) pool: one
    pinned copy per model), `pinned-lru` (λScale: that one registered-memory replica, FaaScale
    §5, plus best-effort LRU copies where its instances ran, λScale §7.5), `all`, `none`."""
    keep_alive_s: float | None = None
    """Host-cache keep-alive for the LRU copies (`lru`, `pinned-lru`); None = only LRU
    evicts."""
    host_cache_fraction: float = 0.5
    """Fraction of host memory given to the model cache."""
    pipeline_size: int = 1
    """Workers of one instance for `registry-parallel` loads with `group_sizing` "fixed";
    the most workers Alg. 1 may pick with "alg1" (ParaServe parallelism size)."""
    group_sizing: str = "fixed"
    """`fixed` (`pipeline_size` workers), `alg1` (ParaServe §4.1 Alg. 1 picks the
    smallest group that meets the SLOs, placed by §4.2 Alg. 2's contention-aware shares;
    a single cold start is fetched in parallel by the group) or `flexpipe` (FlexPipe §5-§6:
    stage count from the arrivals' CV, `surge.policy.flexpipe.system`)."""
    host_sources_when_hot: bool = True
    """Host copies (elsewhere, or a destination's own) are used even when a GPU copy
    exists (λScale §5 locality-driven start-up). False: only when no instance holds the
    model (BlitzScale §2/§5.3: multicast from deployed instances over the compute
    network; the O(1) host copy is for 0->N)."""
    sources_by_bandwidth: bool = False
    """Multicast sources are ranked by the egress bandwidth they have left (BlitzScale §5.1
    Alg. 1 line 5 pops the source with the most `CurrentBW_s`): copies already sending an
    earlier scale-out's multicast go after free ones, and a host copy of the parameter
    pool (§5.3) before any GPU copy whose egress is held. False: GPU copies by load."""
    prune_busy_sources: bool = True
    """BlitzScale §5.1 Alg. 1 line 2, the interference-free plan (Fig. 17's "+Plan"): a
    copy whose egress carries serving traffic (a P/D prefill instance's K/V, `Copy.
    busy_egress`) is pruned from the sources, sending only when no other copy is left.
    False: sources are chosen without regard to serving traffic (Fig. 17's "+Network"
    step: Alg. 1's chains by bandwidth, without the prune)."""
    shard_multicast: bool = False
    """A tensor-parallel target's GPUs each receive their own shard of every block over
    their own network link, from the same GPU index of the sender (BlitzScale §2-§3 and
    Table 1 count scaling bandwidth per GPU: "200 Gbps per-GPU"). False: the lead GPU
    receives whole blocks and forwards each block's shards to the other GPUs inside the
    machine as it lands (λScale §4.3 Case 2)."""
    consolidation: str = "none"
    """After a `registry-parallel` group serves: `none` (it serves as a group for life),
    `scale-up` (every member fetches the rest and becomes an instance), `predictor`
    (ParaServe §6.1: the sliding-window predictor chooses scale-down to fewer instances
    or scale-up; requests move with their KV cache)."""
    predictor_window_s: float = 60.0
    """Sliding window of the §6.1 predictor, seconds."""
    live_batch: int = 4
    """BlitzScale live scaling: queued requests prefilled together by one step (§5.2)."""
    live_load_ratio: float = 1.0
    """BlitzScale zigzag Time_l (layer load time / layer execution time) used until the
    run has measured it (`policy.blitzscale.live_scaling.measured_load_ratio`)."""
    live_decode_partners: bool = False
    """Counterfactual (unsourced): under P/D decode instances run live batches' last layers
    too, and decode those requests (surge before 2026-11-29). Default: prefill instances
    only (`policy.blitzscale.live_scaling.cooperating`, BlitzScale §5.2)."""
    live_least_loaded: bool = False
    """Counterfactual (unsourced): a live batch's last layers run on the least loaded
    cooperating instance, unpaired, and the target takes every instance's queued requests
    (surge before 2026-11-29). Default: each new instance pairs with an overloaded one and
    takes its queue (`policy.blitzscale.live_pair.pair_with`, BlitzScale §5.2)."""
    serve: bool = False
    """`surge serve` can carry this system out on real bytes (the others exist only in the
    simulator: idealised baselines)."""
    stage_hop_s: float = 0.001
    """Activation hop between pipeline stages, per forward step, seconds."""
    init_s: float = 0.0
    """Engine start-up: after the weights are in, or beside their fetch and load with
    `init_overlaps_load` (`surge.policy.startup.serving_at_s`). The simulator charges it,
    and the emulated runtime paces it on the serving clock (`runtime/scaleout/local.py`
    `engine_start`); on real hardware the engine's own start is what it takes. No paper
    gives a number for any system's value below: each is marked unsourced where it is set
    (docs/emulation.md "Engine starts")."""
    init_overlaps_load: bool = False
    """`init_s` runs from the instance's launch while its weights are fetched and loaded
    (ParaServe §5.1 prefetcher, §5.2 parameter manager: Eq. 5's max(start-up, fetch));
    False: it begins once they are in."""
    pd_disaggregation: bool = False
    """Prefill and decode instances, KV cache moved over the network (BlitzScale §6)."""
    mutation: bool = False
    """The P/D monitor turns idle or overprovisioned prefill instances into decode ones
    when decode is the bottleneck (§5.2, `policy.blitzscale.pd_mutation.decide_mutation`)."""
    pd: PdSettings = field(default_factory=PdSettings)
    """The P/D monitor's thresholds (`surge.policy.blitzscale.pd`): when decode is the
    bottleneck."""
    decision_interval_s: float = 0.1
    """Autoscaler decisions happen on ticks of this period (arrivals batch into one)."""
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)
    """Autoscaler settings of every deployment (one pool per model, under P/D too: the
    instances take roles, `surge.policy.blitzscale.pd`)."""
    routing: str = "least-loaded"
    """How the router picks an endpoint (`surge.policy.router.ROUTINGS`): `least-loaded`
    spreads requests, `pack` fills the busiest endpoint under its target first (FlexPipe)."""
    flexpipe: FlexPipeSettings = field(default_factory=FlexPipeSettings)
    """FlexPipe's granularity knobs (CV window, decision interval, stage counts; read when
    `group_sizing` is `flexpipe`): the runtime's scale-out, the controller's granularity
    loop and the simulator all read these, so they decide alike."""

    def __post_init__(self) -> None:
        checks = (
            ("load", self.load, LOADS),
            ("serve_while_loading", self.serve_while_loading, SERVE_WHILE_LOADING),
            ("host_cache", self.host_cache, HOST_CACHES),
            ("cold_fallback", self.cold_fallback, COLD_FALLBACKS),
            ("group_sizing", self.group_sizing, GROUP_SIZINGS),
            ("consolidation", self.consolidation, CONSOLIDATIONS),
            ("routing", self.routing, ROUTINGS),
            ("multicast_transport", self.multicast_transport, MULTICAST_TRANSPORTS),
        )
        for name, value, allowed in checks:
            if value not in allowed:
                raise SurgeError(f"system {self.name}: {name} must be one of {allowed}")
        if self.num_blocks < 1 or self.max_sources < 1 or self.pipeline_size < 1:
            raise SurgeError(f"system {self.name}: blocks, sources, pipeline size must be >= 1")
        if not 0 < self.live_start_fraction <= 1:
            raise SurgeError(f"system {self.name}: live_start_fraction must be in (0, 1]")
        if not self.decision_interval_s > 0:
            raise SurgeError(f"system {self.name}: decision_interval_s must be > 0")
        if min(self.group_setup_s, self.stage_hop_s, self.init_s) < 0:
            raise SurgeError(f"system {self.name}: times must be >= 0")
        if self.live_batch < 1 or not self.live_load_ratio > 0 or not self.predictor_window_s > 0:
            raise SurgeError(f"system {self.name}: live_batch >= 1, ratios and windows > 0")
        if not 0 < self.host_cache_fraction <= 1:
            raise SurgeError(f"system {self.name}: host_cache_fraction must be in (0, 1]")

    @property
    def waited_setup_s(self) -> float:
        """What the runtime waits before a multicast for a group it does not create: the
        modelled `group_setup_s` with the `blocks` transport, 0 with `gloo` (its group's
        real creation is the cost)."""
        return self.group_setup_s if self.multicast_transport == "blocks" else 0.0


NCCL_GROUP_SETUP_S = 0.1
"""Seconds to create an NCCL communicator for one scale-out's GPUs (BlitzScale §5:
"establishing communication group between machines is slow (e.g., 100 ms) when using
off-the-shelf group communicators (e.g., NCCL)"; λScale §7.2: "up to hundreds of
milliseconds"). The `nccl` system's `group_setup_s`: what the simulator charges before its
chain, and the least an emulated run's real gloo group's creation lasts."""
BLITZSCALE_KV_USAGE = PdSettings().kv_busy_fraction
"""KV-cache fraction one BlitzScale instance fills before the monitor asks for another (the
P/D monitor's threshold, 0.8)."""

_AUTOSCALE = AutoscaleSettings(
    target_ongoing_requests=8.0, downscale_delay_s=10.0, keep_alive_s=None
)

_BLITZSCALE_AUTOSCALE = replace(
    _AUTOSCALE,
    downscale_delay_s=2.0,
    count_in_flight=False,
    profile_bounds=True,
    target_kv_usage=BLITZSCALE_KV_USAGE,
)
"""BlitzScale's load monitor (§5.3): the pool's prefill tokens/s, generated tokens/s and
KV-cache use against per-instance upper bounds profiled offline from the model's cost and
SLO (`policy.blitzscale.monitor.profiled`; requests in flight size nothing), and a 2 s
timeout before an idle instance goes (the last one too: keep_alive_s None). A deployment's
own `autoscaling` fields override these (a bound it sets is not profiled)."""

FLEXPIPE_RECLAIM_S = 300.0
"""FlexPipe §9.4: the capacity above its always-ready floor "is allocated through elastic
scaling with 5-minute reclamation windows": an idle group goes back after 5 minutes."""
FLEXPIPE_ALWAYS_READY = 0.30
"""FlexPipe §9.1: it "maintains only 30% of peak capacity as always-ready resources, with
remaining capacity allocated through dynamic scaling" (§9.4 the same; §9.6: "from 75% to
just 30% of historical peak capacity"). The peak is the pool's own, in groups
(`policy.autoscale.ready_floor`)."""

_FLEXPIPE_AUTOSCALE = replace(
    _AUTOSCALE,
    downscale_delay_s=FLEXPIPE_RECLAIM_S,
    always_ready_fraction=FLEXPIPE_ALWAYS_READY,
)
"""FlexPipe's reclamation (§7: the system "automatically reclaims resources when requests
subside"): 30% of the pool's peak groups always ready (§9.1), the rest reclaimed after
5 idle minutes (§9.4). With the `pack` router the surplus groups are the idle ones. Until
2026-11-28 this was BlitzScale's 2-s scale-down (unsourced for FlexPipe) and no floor."""

SYSTEMS: dict[str, SystemConfig] = {
    # λScale §4: binomial k-way multicast, execution pipelines, mode switch; host memory:
    # one registered replica (FaaScale §5) and best-effort local copies (λScale §7.5: "As
    # ServerlessLLM, λScale supports best-effort local host memory caching but falls back
    # to λPipe multicast if the requested model is not in host memory").
    "lambdascale": SystemConfig(
        "lambdascale",
        "multicast",
        multicast_strategy="binomial",
        max_sources=4,
        serve_while_loading="pipelines",
        host_cache="pinned-lru",
        autoscale=_AUTOSCALE,
        serve=True,
    ),
    # BlitzScale §4-§5: chains, live cooperative execution, O(1) host pool, P/D, 2 s scale-down.
    "blitzscale": SystemConfig(
        "blitzscale",
        "multicast",
        multicast_strategy="chain",
        max_sources=4,
        serve_while_loading="live",
        live_start_fraction=1 / 16,  # §4: live once the first block (layers) has landed
        host_sources_when_hot=False,
        sources_by_bandwidth=True,
        shard_multicast=True,
        host_cache="pinned-one",
        pd_disaggregation=True,
        mutation=True,
        autoscale=_BLITZSCALE_AUTOSCALE,
        serve=True,
    ),
    # ParaServe §4-§6: Alg. 1 sizes a pipeline group, Alg. 2 places it by contention, the
    # group fetches disjoint parts in parallel and serves at once, overlapped init; the
    # §6.1 predictor then consolidates (scale-down or scale-up, KV cache migrated).
    "paraserve": SystemConfig(
        "paraserve",
        "registry-parallel",
        pipeline_size=4,
        group_sizing="alg1",
        consolidation="predictor",
        host_cache="none",
        init_s=0.3,  # unsourced: §2 Fig. 1 and §5 give the stages, not their seconds
        init_overlaps_load=True,
        autoscale=_AUTOSCALE,
        serve=True,
    ),
    # FlexPipe §5-§7: each instance is a pipeline whose stage count follows the arrivals' CV
    # (Eq. 4), cut by the partition DP (Eq. 2), placed by Eq. 6, refactored in flight (Eq. 10);
    # stages load in parallel from host copies (§7). `policy/flexpipe/system.py`.
    "flexpipe": SystemConfig(
        "flexpipe",
        "registry-parallel",
        pipeline_size=4,
        group_sizing="flexpipe",
        host_cache="all",
        init_s=0.1,  # unsourced: §9 reports initialization latency only as ratios
        autoscale=_FLEXPIPE_AUTOSCALE,
        routing="pack",
        serve=True,
    ),
    # ServerlessLLM: host cache with keep-alive, SSD on a miss, load-then-serve.
    "serverlessllm": SystemConfig(
        "serverlessllm",
        "local",
        host_cache="lru",
        keep_alive_s=None,
        init_s=0.5,  # unsourced (λScale Fig. 12 implies ~3 s: sllm_start_from_fig12)
        autoscale=_AUTOSCALE,
        serve=True,
    ),
    # FaaSNet: binary-tree GPU multicast, load-then-serve, SSD when no GPU copy (λScale §7.5).
    "faasnet": SystemConfig(
        "faasnet",
        "multicast",
        multicast_strategy="binary-tree",
        cold_fallback="local",
        host_cache="none",
        autoscale=_AUTOSCALE,
    ),
    # NCCL broadcast (ring = chain) with group creation per scale-out, load-then-serve. The
    # runtime carries it out in a real torch.distributed gloo group with NCCL's algorithm:
    # NCCL's broadcast is a block-pipelined ring (its only broadcast algorithm; trees serve
    # allreduce), which λScale §7.1 adapts per scale-out. gloo's own broadcast collective is a
    # binomial tree per block (its root sends each block ceil(log2 N) times), not NCCL's, so
    # `gloo` stays a counterfactual (Fig. 12's `nccl-tree`). The simulator: the chain after
    # group_setup_s.
    "nccl": SystemConfig(
        "nccl",
        "multicast",
        multicast_strategy="chain",
        group_setup_s=NCCL_GROUP_SETUP_S,
        multicast_transport="gloo-ring",
        cold_fallback="local",
        host_cache="none",
        autoscale=_AUTOSCALE,
    ),
    # AllCache: every host holds every model.
    "allcache": SystemConfig("allcache", "allcache", host_cache="all", autoscale=_AUTOSCALE),
    # Ideal: zero load time (λScale Fig. 14 "Ideal Scaling").
    "ideal": SystemConfig("ideal", "ideal", host_cache="none", autoscale=_AUTOSCALE),
    # Serverless vLLM (ParaServe §8.1 baseline): one worker fetches everything, slow init.
    "serverless-vllm": SystemConfig(
        "serverless-vllm",
        "registry-parallel",
        pipeline_size=1,
        host_cache="none",
        init_s=4.0,  # unsourced: ParaServe §2 Fig. 1's stages, read off a figure, not the text
        autoscale=_AUTOSCALE,
    ),
}
"""Every system by name."""


def system_config(name: str) -> SystemConfig:
    """The system called `name` (or an older alias of it)."""
    name = ALIASES.get(name, name)
    if name not in SYSTEMS:
        raise SurgeError(f"unknown system {name!r}; choose one of {', '.join(SYSTEMS)}")
    return SYSTEMS[name]


def serve_system(name: str) -> SystemConfig:
    """The system called `name`, which `surge serve` must be able to carry out."""
    served = ", ".join(n for n, s in SYSTEMS.items() if s.serve)
    if ALIASES.get(name, name) not in SYSTEMS:
        raise SurgeError(f"unknown strategy {name!r}; choose one of {served}")
    system = system_config(name)
    if not system.serve:
        raise SurgeError(
            f"strategy {name!r} exists only in the simulator; `surge serve` runs {served}"
        )
    return system
