"""BlitzScale's load monitor, the measuring half: tokens/s and KV-cache use per instance.

What flows: every autoscaler tick, `LoadMonitor.observe` samples each instance's endpoint
(`Endpoint.num_tokens`, the tokens it has generated so far, counted as they arrive; the
tokens its requests hold). `tokens_per_s` is the rate over the trailing `RATE_WINDOW_S`;
`kv_usage` is the tokens held over the engine's KV capacity (`max_kv_tokens`) — the
agents do not report their page tables, so this counts tokens, not pages, as
`runtime/migration/pd_handoff.py` and the `vllm:kv_cache_usage_perc` gauge do. The
autoscaler puts both into each `InstanceLoad` (`autoscaler.pool_load`) and
`policy.autoscale.decide` decides (BlitzScale §5.3: instances enough to keep each under
`target_tokens_per_s` and `target_kv_usage`). Owned by control/; decides nothing.
"""

from collections import deque

from surge.policy.autoscale import RATE_WINDOW_S
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
