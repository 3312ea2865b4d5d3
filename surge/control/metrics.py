"""Prometheus metrics of the control plane (one registry per controller)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


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
        self.live_prefilled = Counter(
            "surge_live_prefill_requests",
            "Requests prefilled by live scaling (BlitzScale: layers split new/old instance)",
            ["model"],
            registry=r,
        )
        self.nodes_up = Gauge("surge_nodes_up", "Node agents alive", registry=r)
        self.slo_ttft_ok = Counter(
            "surge_slo_ttft_met",
            "Requests whose TTFT met the deployment's SLO",
            ["model"],
            registry=r,
        )

    def forget(self, model: str) -> None:
        """Drop a deleted deployment's gauges (counters keep their history)."""
        for g in (self.queue, self.ongoing, self.instances, self.loading, self.pipelines):
            for labels in list(g._metrics):  # prometheus_client has no public way
                if labels[0] == model:
                    g.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
