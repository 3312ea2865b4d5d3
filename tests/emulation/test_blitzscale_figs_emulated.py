"""BlitzScale Fig. 17 and Fig. 18 on the emulation (`benchmarks/emulation/blitzscale_ablation.py`,
`blitzscale_fig18.py`): an ablation step is served as the simulator's `SystemConfig` and only
for the run; the step gains; and Fig. 18's measurement on real agents (a tiny model, two
emulated A800s of one machine): the deployment asked for every instance at the replay's zero,
the new one came up, requests were prefilled, and every agent process is gone after."""

import argparse
import os

import pytest

from benchmarks.emulation import blitzscale_fig18 as fig18
from benchmarks.emulation.blitzscale_ablation import STEPS, ablation_steps, gains
from benchmarks.emulation.serving import registered
from benchmarks.emulation.staging import run_on_real_model
from surge.emulation import EmulationConfig
from surge.errors import SurgeError
from surge.policy.systems import serve_system


def test_an_ablation_step_is_served_as_the_simulators_system_for_the_run_only() -> None:
    steps = ablation_steps()
    with registered({"blitzscale-network": steps["+network"], "blitzscale-plan": steps["+plan"]}):
        network, plan = serve_system("blitzscale-network"), serve_system("blitzscale-plan")
        assert network.serve_while_loading == "none" and not network.mutation
        assert not network.prune_busy_sources and plan.prune_busy_sources  # Alg. 1 line 2
        assert network.multicast_strategy == "chain"  # +Network: BlitzScale's planner
    with pytest.raises(SurgeError, match="unknown strategy"):
        serve_system("blitzscale-network")
    with pytest.raises(ValueError, match="shipped"), registered({"blitzscale": steps["+plan"]}):
        pass
    assert serve_system("blitzscale").serve_while_loading == "live"


def test_each_step_gains_over_the_one_before() -> None:
    res = {
        "serverlessllm": {"ttft_mean_s": 1.0, "tbt_mean_s": 0.02},
        "+network": {"ttft_mean_s": 0.5, "tbt_mean_s": 0.025},
        "+plan": {"ttft_mean_s": 0.5, "tbt_mean_s": None},
    }
    g = gains(res)
    assert g["+network_ttft_mean_s"] == 0.5 and g["+network_tbt_mean_s"] == -0.25
    assert g["+plan_ttft_mean_s"] == 0.0 and g["+plan_tbt_mean_s"] is None
    assert g["+live_ttft_mean_s"] is None  # not run
    assert len(g) == 2 * (len(STEPS) - 1)


@pytest.mark.timeout(400)
def test_fig18_scales_at_once_on_real_agents_and_stops_them(monkeypatch) -> None:
    clusters = []
    real_cluster = fig18.emulated_cluster

    def keep(*a, **kw):
        clusters.append(real_cluster(*a, **kw))
        return clusters[-1]

    monkeypatch.setattr(fig18, "emulated_cluster", keep)
    args = argparse.Namespace(
        nodes=2, rate=4.0, duration=2.0, after=0.3, prompt=64, max_prompt=64, max_tokens=1,
        max_num_seqs=4, layers=2, blocks=2, systems="blitzscale,serverlessllm",
        cluster="loopback", cpu_per_node=None,
    )  # fmt: skip
    config = EmulationConfig.parse("blitzscale-a-4x4:llama2-7b", 5.0)
    wl = fig18.workload(args)
    with registered({"blitzscale-colocated": fig18.systems()["blitzscale"]}):
        out, _ = run_on_real_model(args, config, lambda t, m, e: fig18.run_all(args, t, m, e, wl))
    for system in ("blitzscale", "serverlessllm"):
        res = out[system]
        # min_replicas raised at the replay's zero: the second GPU's instance came up after it
        assert [node for _, node in res["instances_up"]] == [1], system
        assert 0 < res["scale_done_s"] < args.duration, system
        assert res["serving_timeline"][-1][1] == 2
        assert res["ttft_mean_s"] is not None and res["finished"] >= 1
    readings = fig18.emulated_readings(out, args.prompt)
    assert readings["reference_prefill_tokens_per_s"] > 0
    assert set(readings["scale_done_s"]) == {"blitzscale", "serverlessllm"}
    procs = [p for c in clusters for p in c.procs.values()]
    assert len(procs) == 2
    for p in procs:  # every agent stopped, by its own PID
        assert p.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)
