"""Requests of the HTTP API: submit to a deployment's router, book-keep when done, abort.

What flows: prompt token ids and `SamplingParams` in (from `surge/api/app.py`); a
`TrackedRequest` out, queued on the deployment's `Server` (runtime), which routes it by
`surge.policy.router`. When the API is done with it, its Prometheus metrics (requests,
tokens, TTFT, TPOT, SLO) are recorded and, if it still runs (stop string hit, client
gone), it is aborted on its instance (`instance_abort`). A request reaching a model at
zero wakes the autoscaler at once (the activator). Before a request is queued, the hold
queue's bound is checked (`admission.check`: 429 when full, 503 when the deployment has
failed). Owned by control/.
"""

import itertools
import time
from collections.abc import Callable

from surge.control import admission
from surge.control.metrics import Metrics
from surge.control.state import Deployment, TrackedRequest
from surge.engine.sampling import SamplingParams
from surge.runtime.client import ClusterClient
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.protocol import InstanceAbortOp


class Requests:
    """Submit, finish and abort requests of the controller's deployments."""

    def __init__(
        self,
        client: ClusterClient,
        deployments: dict[str, Deployment],
        metrics: Metrics,
        wake_autoscaler: Callable[[], None],
    ) -> None:
        self.client, self.deployments, self.metrics = client, deployments, metrics
        self.wake_autoscaler = wake_autoscaler

    async def submit(
        self, dep: Deployment, prompt_token_ids: list[int], params: SamplingParams
    ) -> TrackedRequest:
        admission.check(dep, self.metrics)
        req_id = f"{dep.name}-{time.monotonic_ns()}"
        req = TrackedRequest(req_id, list(prompt_token_ids), params, clock=dep.server.clock)
        req.deployment = dep.name
        req.at_zero = not dep.serving() and not dep.server.endpoints
        dep.server.requests[req.req_id] = req
        self._count(dep)
        await dep.server.submit(req)
        if not dep.instances:
            self.wake_autoscaler()  # a request at zero: scale out at once (activator)
        return req

    def finished(self, req: TrackedRequest, status: str = "ok") -> None:
        """Book-keeping when the API is done with a request (metrics, forget it)."""
        dep = self.deployments.get(req.deployment)
        self._record(dep, req, status)
        if dep is None:
            return
        dep.server.requests.pop(req.req_id, None)
        self._count(dep)
        if not req.done.is_set() or req.finish_reason in ("stop_string", "abort"):
            self._abort(dep, req)

    def _count(self, dep: Deployment) -> None:
        # The gauge moves with the books, not only at the autoscaler's next tick: a scrape
        # right after a client went away must not count its requests (a tick may be late).
        self.metrics.ongoing.labels(dep.name).set(len(dep.requests))

    def _record(self, dep: Deployment | None, req: TrackedRequest, status: str) -> None:
        m, name = self.metrics, req.deployment
        m.requests.labels(name, status).inc()
        m.tokens.labels(name).inc(len(req.output_token_ids))
        if req.cached_tokens is not None:
            m.record_prefix_cache(name, len(req.prompt_token_ids), req.cached_tokens)
        if req.first_token_t is None:
            return
        ttft_s = req.first_token_t - req.arrival_t
        m.ttft.labels(name).observe(ttft_s)
        m.vllm_ttft.labels(name).observe(ttft_s)
        times = req.token_times
        for a, b in itertools.pairwise(times):
            m.vllm_itl.labels(name).observe(b - a)
        m.vllm_e2e.labels(name).observe((req.done_t or times[-1]) - req.arrival_t)
        if req.at_zero:  # it waited for a scale-out from zero
            start = (dep.last_start if dep is not None else None) or "unknown"
            m.scale_out_wait.labels(name, start).observe(ttft_s)
        slo_ms = dep.spec.slo.ttft_ms if dep is not None else None
        if slo_ms and ttft_s * 1000 <= slo_ms:
            m.slo_ttft_ok.labels(name).inc()
        n = len(req.token_times)
        if n > 1:
            m.tpot.labels(name).observe((req.token_times[-1] - req.token_times[0]) / (n - 1))

    def _abort(self, dep: Deployment, req: TrackedRequest) -> None:
        """Stop generating a request nobody waits for (stop string hit, client gone)."""
        req.finish(req.finish_reason or "abort")
        for ep in list(dep.server.endpoints.values()):
            if req.req_id not in ep.requests:
                continue
            ep.requests.pop(req.req_id, None)
            if isinstance(ep, LocalEndpoint):
                # On a pooled connection, not the node's control one: the agent answers an
                # abort at its next step boundary (a long prefill: minutes on a CPU), and
                # the control connection carries one exchange at a time, so every later op
                # to the node (the next request's submit) would wait for that step too.
                op = InstanceAbortOp(instance=ep.name, req_ids=(req.req_id,))
                dep.spawn(self.client.call_bytes(ep.node, op))
        dep.server.drop(req)
