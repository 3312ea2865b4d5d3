"""FlexPipe §9 on the emulation (`benchmarks/emulation/flexpipe.py`): the simulator beside
the emulated runtime runs the scenario the runtime serves — the same warm instance, batch
limit, autoscaler knobs and starting copies (before, it ran a cold start at 64 sequences
and the system's own target, against the runtime's one warm instance at 8 and target 4)."""

import argparse

from benchmarks.emulation.flexpipe import copies, deployed, simulated, spec
from surge.control.spec import DeploymentSpec
from surge.emulation import EmulationConfig
from surge.policy.systems import SYSTEMS, system_config


def args(**kw) -> argparse.Namespace:
    base = dict(
        nodes=8, rate=4.0, duration=3.0, seed=1, prompt_tokens=512, output_tokens=128,
        target_ongoing=4.0, max_num_seqs=8, store="/nowhere",
    )  # fmt: skip
    return argparse.Namespace(**(base | kw))


def test_simulator_autoscales_as_the_deployment_does() -> None:
    a = args()
    for variant in ("flexpipe", "static-1", "serverlessllm"):
        d = spec(variant, a)
        runtime = DeploymentSpec.from_json(d).autoscaling
        sim = deployed(variant, a)(system_config(d["strategy"])).autoscale
        assert sim == runtime
        assert sim.target_ongoing_requests == 4.0 and sim.min_replicas == 1


def test_copies_where_the_simulated_system_keeps_them() -> None:
    assert SYSTEMS["flexpipe"].host_cache == "all"  # the simulator loads from host memory
    assert copies("flexpipe", 8) == (list(range(1, 8)), list(range(8)))
    assert copies("static-4", 8) == (list(range(1, 8)), list(range(8)))
    assert copies("serverlessllm", 8) == (list(range(1, 8)), [0])


def test_simulator_holds_the_agents_batch_limit_and_a_warm_instance() -> None:
    config = EmulationConfig.parse("flexpipe:llama2-7b", 20.0)
    wide = simulated(args(max_num_seqs=8), config, ["static-1"], [4.0])["4"]["static-1"]
    narrow = simulated(args(max_num_seqs=2), config, ["static-1"], [4.0])["4"]["static-1"]
    # one warm instance: the first request is served at once (no cold load)
    assert wide["ttfts_s"][0] < 0.1
    # two sequences per instance: the burst queues behind them
    assert narrow["ttft_p90_s"] > 1.5 * wide["ttft_p90_s"]
