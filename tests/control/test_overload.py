"""Overload (issue 14 #3): a bounded hold queue per deployment (429 past the bound, 503 past
the hold timeout, both with Retry-After) that frees everything a refused request held;
min_replicas beyond the cluster refused at deploy; and /metrics after a request: the vLLM
names and the cold-start series."""

import asyncio
import time

import pytest

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.errors import Overloaded, SurgeError, Unavailable
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig


def _value(text: str, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    assert seen, f"{name} {labels} not in /metrics"
    return total


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_hold_queue_refuses_past_its_bound_and_times_out_held_requests(tmp_path, tiny_store_dir):
    state = tmp_path / "state"
    (state / "registry").mkdir(parents=True)
    cluster = LocalCluster(LocalClusterConfig(num_nodes=1, remote_dir=state / "registry"))
    params = SamplingParams(max_tokens=6, ignore_eos=True)

    async def run() -> None:
        c = Controller(ControllerConfig(state_dir=state, nodes=1), cluster.addresses, cluster.token)
        await c.start()
        try:
            with pytest.raises(SurgeError, match=r"1 nodes x 1 slots.*at most 1 instances"):
                spec = {"name": "big", "model": str(tiny_store_dir)}
                await c.create({**spec, "autoscaling": {"min_replicas": 5}})
            assert not c.describe_all(), "a refused deployment must leave nothing behind"

            # A request at zero waits for a scale-out, then is served: every series moves.
            a = await c.create(
                {"name": "a", "model": str(tiny_store_dir), "autoscaling": {"keep_alive_s": 600}}
            )
            req = await c.submit(a, [1, 2, 3], params)
            await asyncio.wait_for(req.done.wait(), 60)
            c.finished(req)
            await c._w.autoscaler.tick(time.monotonic(), 0.1)
            text = c.metrics.render().decode()
            for name in (
                "vllm:time_to_first_token_seconds_count",
                "vllm:inter_token_latency_seconds_count",
                "vllm:e2e_request_latency_seconds_count",
            ):
                assert _value(text, name, model_name="a") >= 1, name
            assert _value(text, "vllm:inter_token_latency_seconds_count", model_name="a") == 5
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                assert _value(text, name, model_name="a") == 0
            assert 0 <= _value(text, "vllm:kv_cache_usage_perc", model_name="a") <= 1
            assert _value(text, "surge_scale_out_wait_seconds_count", model="a") == 1
            for phase in ("placement", "load", "first_endpoint"):
                assert _value(text, "surge_scale_out_phase_seconds_count", phase=phase) == 1

            # "a" keeps the only slot: "b" can only hold its requests.
            b = await c.create(
                {
                    "name": "b",
                    "model": str(tiny_store_dir),
                    "admission": {"max_queued_requests": 2, "hold_timeout_s": 1.0},
                }
            )
            held = [await c.submit(b, [1, 2], params) for _ in range(2)]
            t0 = time.monotonic()
            with pytest.raises(Overloaded) as full:
                await c.submit(b, [1, 2], params)
            assert full.value.retry_after_s == 1 and "max_queued_requests 2" in str(full.value)
            for r in held:
                await asyncio.wait_for(r.done.wait(), 10)
                assert r.finish_reason == "error"
                assert isinstance(r.exception, Unavailable)
                assert r.exception.retry_after_s == 1
                assert "hold_timeout_s 1" in str(r.exception)
                c.finished(r, "error")
            assert 0.9 <= time.monotonic() - t0 < 5
            # Nothing is left ongoing: the deployment holds no request, queue or slot.
            assert not b.requests and not b.server.queue and not b.server.requests
            assert not b.instances
            assert c.describe(b)["status"]["ongoing"] == 0
            text = c.metrics.render().decode()
            assert _value(text, "surge_requests_refused_total", model="b", status="429") == 1
            assert _value(text, "surge_requests_refused_total", model="b", status="503") == 2
            # The queue has room again.
            again = await c.submit(b, [1, 2], params)
            c.finished(again, "cancelled")
            assert not b.server.queue
        finally:
            await c.stop()

    with cluster:
        asyncio.run(run())
