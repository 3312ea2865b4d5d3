"""BlitzScale's load monitor, the measuring half: tokens/s and KV-cache use per instance,
and the deployment's whole load as `policy.autoscale` reads it (`pool_load`).

What flows: every autoscaler tick, `LoadMonitor.observe` samples each instance's endpoint
(`Endpoint.num_tokens`, the tokens it has generated so far, counted as they arrive; the
tokens its requests hold). `tokens_per_s` is the rate over the trailing `RATE_WINDOW_S`;
`kv_usage` is the tokens held over one instance's KV capacity (the autoscaler's
`kv_tokens`: the engine's `max_kv_tokens`, or the emulated GPU's under emulation) — the
agents do not report their page tables, so this counts tokens, not pages, as
`runtime/migration/pd_handoff.py` and the `vllm:kv_cache_usage_perc` gauge do. The
autoscaler puts both into each `InstanceLoad` (`pool_load`, here) and
`policy.autoscale.decide` decides (BlitzScale §5.3: instances enough to keep each under
`target_tokens_per_s` and `target_kv_usage`). Owned by control/; decides nothing.
"""

from collections import deque

from surge.control.state import Deployment
from surge.policy.autoscale import RATE_WINDOW_S, InstanceLoad, PoolLoad
from surge.runtime.endpoints import Endpoint


def kv_usage(ep: Endpoint, max_kv_tokens: int) -> float:
    """Fraction of an instance's KV cache its requests hold (tokens, 0..1)."""
    held = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in ep.requests.values())
    return min(1.0, held / max_kv_tokens) if max_kv_tokens > 0 else 0.0


class LoadMonitor:
    """Token counts of every instance over the trailing window, keyed by endpoint name."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, int]]] = {}

    def observe(self, ep: Endpoint, now_s: float) -> None:
        """Sample `ep`'s token count now (once per tick). An instance seen for the first time
        starts at zero: what it made before (at most a tick) counts as made in the window."""
        samples = self._samples.get(ep.name)
        if samples is None:
            samples = self._samples[ep.name] = deque([(now_s, 0)])
        samples.append((now_s, ep.num_tokens))
        while len(samples) > 2 and samples[1][0] <= now_s - self.window_s:
            samples.popleft()

    def tokens_per_s(self, ep: Endpoint, now_s: float) -> float:
        """Tokens `ep` generated over the trailing window, per second of the window (a
        fresh instance's rate ramps up over its first window, as PdServing's does)."""
        samples = self._samples.get(ep.name)
        if not samples:
            return 0.0
        _, start = samples[0]
        return (ep.num_tokens - start) / self.window_s

    def forget(self, live: set[str]) -> None:
        """Drop the samples of endpoints not in `live` (retired instances)."""
        for name in [n for n in self._samples if n not in live]:
            del self._samples[name]


def pool_load(
    dep: Deployment, now_s: float, monitor: LoadMonitor | None = None, max_kv_tokens: int = 0
) -> PoolLoad:
    """The deployment as `policy.autoscale` sees it: its instances (loading until their
    endpoint is up; a multicast source is busy; with a `monitor`, each one's tokens/s and
    KV use, and the prompt tokens of requests without a first token) and the requests
    waiting for one — at the router or on an execution pipeline. The simulator builds the
    same view (`sim/scaling.pool_load`; its tokens/s is the decode rate at that moment, its
    KV use the tokens reserved)."""
    # A FlexPipe pipeline's members share its endpoint: one instance, counted once.
    first = {id(i.endpoint): i.node for i in reversed(dep.instances.values()) if i.endpoint}
    loads = tuple(
        InstanceLoad(
            instance_id=i.node,
            outstanding=i.endpoint.outstanding if i.endpoint else 0,
            loading=i.endpoint is None or i.num_sending > 0,
            idle_since_s=i.idle_since_s if i.num_sending == 0 else None,
            tokens_per_s=monitor.tokens_per_s(i.endpoint, now_s) if monitor and i.endpoint else 0.0,
            kv_usage=kv_usage(i.endpoint, max_kv_tokens) if monitor and i.endpoint else 0.0,
        )
        for i in dep.instances.values()
        if i.endpoint is None or first[id(i.endpoint)] == i.node
    )
    ongoing = [r for r in dep.requests.values() if not r.done.is_set()]
    # the load monitor's prefill load: prompt tokens of requests without a first token yet
    pending = (
        sum(len(r.prompt_token_ids) for r in ongoing if r.first_token_t is None) if monitor else 0
    )
    queued = max(0, len(ongoing) - sum(x.outstanding for x in loads))
    return PoolLoad(now_s, queued, loads, pending)
