"""Prometheus metrics of the control plane (one registry per controller).

Beside surge's own `surge_*` series, the names the ecosystem's dashboards and autoscalers
read from vLLM (`vllm:*`, labelled `model_name`), and cold-start series: how long requests
waited for a scale-out, and each scale-out's phases. Written by `requests.py` (per request),
`autoscaler.py` (per tick and per scale-out) and `admission.py` (refusals). Owned by control/.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
SCALE_OUT_PHASES = ("placement", "load", "first_endpoint")
"""Phases of one scale-out: choosing its nodes; until every destination is loaded (local
loads and multicasts); until its first endpoint (a pipeline or a local instance) serves."""


class Metrics:
    """Every series surge exports; `render()` gives the text exposition format."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "surge_requests",
            "Requests finished, by model and outcome",
            ["model", "status"],
            registry=r,
        )
        self.tokens = Counter("surge_generated_tokens", "Tokens generated", ["model"], registry=r)
        self.ttft = Histogram(
            "surge_ttft_seconds",
            "Time to first token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "surge_tpot_seconds",
            "Time per output token after the first",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Gauge(
            "surge_queue_length", "Requests waiting at the router", ["model"], registry=r
        )
        self.ongoing = Gauge(
            "surge_ongoing_requests", "Requests queued or running", ["model"], registry=r
        )
        self.instances = Gauge(
            "surge_instances", "Local instances serving (not loading)", ["model"], registry=r
        )
        self.loading = Gauge(
            "surge_instances_loading", "Instances still loading", ["model"], registry=r
        )
        self.pipelines = Gauge(
            "surge_pipelines", "Execution pipelines serving while loading", ["model"], registry=r
        )
        self.blocks_in_flight = Gauge(
            "surge_blocks_in_flight", "Blocks being loaded or multicast", ["model"], registry=r
        )
        self.emulation_steps = Counter(
            "surge_emulation_steps",
            "Engine steps paced by GPU-time emulation, per node (docs/emulation.md)",
            ["node"],
            registry=r,
        )
        self.emulation_violations = Counter(
            "surge_emulation_violations",
            "Paced steps whose real work overran the emulated GPU's time, per node",
            ["node"],
            registry=r,
        )
        self.bytes_moved = Counter(
            "surge_bytes_moved", "Block bytes landed in a tier", ["model", "tier"], registry=r
        )
        self.gpu_seconds = Counter(
            "surge_gpu_seconds",
            "Slot-seconds held by instances (loading or serving)",
            ["model"],
            registry=r,
        )
        self.scale_outs = Counter(
            "surge_scale_outs",
            "Scale-outs, by start kind (hot/warm/cold)",
            ["model", "start"],
            registry=r,
        )
        self.released = Counter(
            "surge_instances_released", "Instances released", ["model"], registry=r
        )
        self.kv_migrated = Counter(
            "surge_kv_migrated_requests",
            "Requests moved with their KV cache (ParaServe consolidation)",
            ["model"],
            registry=r,
        )
        self.consolidations = Counter(
            "surge_consolidations",
            "ParaServe pipeline groups consolidated onto their kept members (§6.1)",
            ["model"],
            registry=r,
        )
        self.pipelines_opened = Counter(
            "surge_pipelines_opened",
            "Execution pipelines opened to serve while a model loads (λScale §4.3)",
            ["model"],
            registry=r,
        )
        self.live_prefilled = Counter(
            "surge_live_prefill_requests",
            "Requests prefilled by live scaling (BlitzScale: layers split new/old instance)",
            ["model"],
            registry=r,
        )
        self.refactors = Counter(
            "surge_pipeline_refactors",
            "FlexPipe inflight refactorings of live pipelines (split: more stages, merge: fewer)",
            ["model", "direction"],
            registry=r,
        )
        self.pd_handoffs = Counter(
            "surge_pd_handoffs",
            "Requests whose KV cache a prefill instance handed to a decode instance (P/D)",
            ["model"],
            registry=r,
        )
        self.pd_mutations = Counter(
            "surge_pd_mutations",
            "Prefill instances turned into decode instances in place (BlitzScale §5.2)",
            ["model"],
            registry=r,
        )
        self.pd_instances = Gauge(
            "surge_pd_instances", "Serving instances by P/D role", ["model", "role"], registry=r
        )
        self.nodes_up = Gauge("surge_nodes_up", "Node agents alive", registry=r)
        self.slo_ttft_ok = Counter(
            "surge_slo_ttft_met",
            "Requests whose TTFT met the deployment's SLO",
            ["model"],
            registry=r,
        )

        self.refused = Counter(
            "surge_requests_refused",
            "Requests refused by the hold queue: 429 (full) or 503 (held past hold_timeout_s)",
            ["model", "status"],
            registry=r,
        )
        self.scale_out_wait = Histogram(
            "surge_scale_out_wait_seconds",
            "Arrival to first token of requests that arrived while the model had no serving "
            "instance, by the start kind of its last scale-out (hot/warm/cold)",
            ["model", "start"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.scale_out_phase = Histogram(
            "surge_scale_out_phase_seconds",
            "Scale-out phases: placement, load (until every destination is loaded), "
            "first_endpoint (until its first endpoint serves); by start kind",
            ["model", "start", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # vLLM's names (model_name label), so dashboards and autoscalers built for vLLM work.
        self.vllm_running = Gauge(
            "vllm:num_requests_running",
            "Requests on an instance or pipeline (not waiting)",
            ["model_name"],
            registry=r,
        )
        self.vllm_waiting = Gauge(
            "vllm:num_requests_waiting",
            "Requests waiting for an instance (the hold queue)",
            ["model_name"],
            registry=r,
        )
        self.vllm_ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.vllm_itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens",
            ["model_name"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.vllm_e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to last token",
            ["model_name"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.vllm_kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache use, 0..1 (approximate: tokens of running requests over the serving "
            "instances' KV capacity; agents do not report their block tables)",
            ["model_name"],
            registry=r,
        )

        self.vllm_prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the instances' prefix caches",
            ["model_name"],
            registry=r,
        )
        self.vllm_prefix_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the instances' prefix caches (not recomputed)",
            ["model_name"],
            registry=r,
        )
        self.prefix_hit_rate = Gauge(
            "surge_prefix_cache_hit_rate",
            "Prefix-cache hits over queries, in prompt tokens, since the controller started",
            ["model"],
            registry=r,
        )
        self._prefix_totals: dict[str, list[int]] = {}
        """Model -> [queried, hit] prompt tokens (the gauge's numerator and denominator)."""

    def record_prefix_cache(self, model: str, prompt_tokens: int, cached_tokens: int) -> None:
        """A prefilled request: `cached_tokens` of its `prompt_tokens` came from the cache."""
        self.vllm_prefix_queries.labels(model).inc(prompt_tokens)
        self.vllm_prefix_hits.labels(model).inc(cached_tokens)
        totals = self._prefix_totals.setdefault(model, [0, 0])
        totals[0] += prompt_tokens
        totals[1] += cached_tokens
        self.prefix_hit_rate.labels(model).set(totals[1] / totals[0] if totals[0] else 0.0)

    def forget(self, model: str) -> None:
        """Drop a deleted deployment's gauges (counters keep their history)."""
        gauges = (self.queue, self.ongoing, self.instances, self.loading, self.pipelines)
        gauges = (*gauges, self.pd_instances)
        for g in (*gauges, self.vllm_running, self.vllm_waiting, self.vllm_kv_usage):
            for labels in list(g._metrics):  # prometheus_client has no public way
                if labels[0] == model:
                    g.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
