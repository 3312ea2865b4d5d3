"""BlitzScale §6.1 on the emulation (`benchmarks/emulation/blitzscale.py`): the ratios of
BlitzScale's TTFT to each baseline's, and a first sitting that ran only baselines."""

import argparse

import numpy as np

from benchmarks.emulation.blitzscale import ratios


def test_ratios_to_blitzscale_and_none_before_it_ran() -> None:
    res = {
        "blitzscale": {"ttft_mean_s": 0.5, "ttft_p50_s": 0.4},
        "serverlessllm": {"ttft_mean_s": 1.0, "ttft_p50_s": 0.8},
        "allcache": {"ttft_mean_s": 0.5, "ttft_p50_s": None},
    }
    out = ratios(res)
    assert out["serverlessllm"]["ttft_mean_s"] == 0.5
    assert out["serverlessllm"]["ttft_p50_s"] == 0.5
    assert out["allcache"] == {
        "ttft_mean_s": 1.0,
        "ttft_p50_s": None,
        "ttft_p90_s": None,
        "ttft_p99_s": None,
        "tbt_mean_s": None,
        "tbt_p50_s": None,
    }
    # `--resume` sittings: AllCache alone first; its report has no ratios yet, not a crash
    assert ratios({"allcache": res["allcache"]}) == {}


def test_the_simulator_beside_runs_the_agents_prefill_budget(monkeypatch, tmp_path) -> None:
    """The simulator beside the emulated run prefills as many prompt tokens per step as the
    emulated agents' engines do: it ran its own default (8192 vs the agents' 4096), so an
    8-request burst of 1,024-token prompts was one step there and two on the runtime
    (ServerlessLLM's p90 +18%)."""
    import surge.sim.simulator as simulator
    from benchmarks.emulation.blitzscale import simulated
    from benchmarks.emulation.serving import Workload
    from surge.emulation import Emulation, EmulationConfig
    from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
    from surge.sim.result import SimResult

    seen = []

    def fake_simulate(trace, settings, system=None):
        seen.append(settings)
        n, ones = trace.num_requests, np.ones(trace.num_requests)
        ids = np.zeros(n, dtype=np.int64)
        return SimResult(settings.system, ("m",), ones * 0, ones, ones, ids + 1, ids)

    monkeypatch.setattr(simulator, "simulate", fake_simulate)
    config = EmulationConfig.parse("blitzscale-a-hosts:llama2-7b", 40.0)
    args = argparse.Namespace(nodes=2, max_num_seqs=8)
    simulated(args, config, Workload((0.0,), (1024,), (8,)), 0.5)
    cluster = LocalCluster(
        LocalClusterConfig(
            num_nodes=2,
            max_num_seqs=8,
            emulation=Emulation(config, 10_000_000, real_kv_bytes_per_token=4096),
            remote_dir=tmp_path,
        )
    )
    engine = cluster.agent_config(0).engine
    assert {s.max_prefill_tokens for s in seen} == {engine.max_prefill_tokens}
    assert {s.max_batch for s in seen} == {engine.max_num_seqs}


def test_the_replay_starts_at_an_autoscaler_tick() -> None:
    """The replay's zero is the controller's next tick (its `Load` event), so the runtime's
    decisions fall at multiples of the tick from the burst's start, as the simulator's; the
    events before it (a block landing) are passed over."""
    import asyncio

    from benchmarks.emulation.serving import next_tick_s
    from surge.events import BlockLanded, Load

    async def run() -> float:
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait(BlockLanded(t_s=3.0, model="m", node=1, block=0, tier="gpu"))
        load = Load(t_s=8.0, model="m", queued=0, ongoing=0, instances=2, loading=0, pipelines=0)
        q.put_nowait(load)
        return await next_tick_s(q, lambda t: t / 4.0)

    assert asyncio.run(run()) == 2.0
