"""The simulator's prediction of one calibration burst, fix by fix
(`benchmarks/sim_calibrate/main.py`).

In: the calibrated cluster and model files (`profiling.sim_files`), a burst's
settings (a scale_burst report) and the profile (`rounds.profile_of`). Out:
per scenario (K = 1, 2 x execute-while-load, stop-the-world) the simulated TTFT p50/p90,
the endpoints' opening times and the multicast's end, after each fix in `FIXES` (each
added to the ones before; the last is the calibrated prediction).
"""

import tempfile
from dataclasses import replace
from pathlib import Path

from benchmarks.sim_calibrate.profiling import burst_trace, sim_files
from benchmarks.sim_calibrate.repeats import SCENARIOS, scenario_name
from benchmarks.sim_calibrate.rounds import PIPELINE_MICRO_BATCHES
from benchmarks.sim_calibrate.testbed import TestbedHost

MODES = {"execute_while_load": "pipelines", "stop_the_world": "none"}
"""Scale-out mode -> the simulated system's `serve_while_loading`."""


def simulate_burst(
    cluster: str,
    model: str,
    real: dict,
    mode: str,
    cores: float | None,
    transfer_cores: float = 0.0,
    micro_batches: int = PIPELINE_MICRO_BATCHES,
    stage_hop_s: float = 0.001,
    opens: dict | None = None,
    pipeline_speed: float = 1.0,
    send_cost_s_per_gb: float = 0.0,
    transfers_first: bool = False,
    serving_transfers_shared: bool = False,
    send_cpu_cores: float = 0.0,
    serving_receive_slowdown: float = 0.0,
    transfer_wakeups: bool = False,
    efficiency_in_transfers: float = 1.0,
    wakeups_queue: bool = False,
    base: str = "lambdascale",
):
    """TTFT p50/p90 of the simulated burst (same percentile rule as scale_burst), scaled
    out by `base`'s system (λScale §7's baselines: `faasnet`, `nccl`, `serverlessllm`)."""
    from benchmarks.scaleout.burst_run import percentile
    from surge.events import BlockLanded, InstanceUp, PipelineOpened, Recorder
    from surge.policy.autoscale_settings import AutoscaleSettings
    from surge.policy.systems import system_config
    from surge.sim.settings import SimSettings
    from surge.sim.simulator import Simulation

    k = real["sources"]
    system = replace(
        system_config(base),
        name=f"{base}-{mode}",
        max_sources=k,
        num_blocks=real["blocks"],
        serve_while_loading=MODES[mode],
        host_cache="none",
        # scale_out starts with the burst (the benchmark calls it at once), to N nodes:
        decision_interval_s=1e-3,
        stage_hop_s=stage_hop_s,
        autoscale=AutoscaleSettings(
            target_ongoing_requests=real["requests"] / real["nodes"],
            downscale_delay_s=60.0,
        ),
    )
    settings = SimSettings(
        cluster=cluster,
        models=(model,),
        system=system.name,
        max_batch=real["max_num_seqs"],
        warm_instances=k,
        pipeline_micro_batches=micro_batches,
        pipeline_speed=pipeline_speed,
    )
    shared = cores is not None
    host = TestbedHost(
        shared_cores=cores,
        transfer_cores=transfer_cores if shared else 0.0,
        endpoint_open_s=opens["endpoint_open_s"] if opens else 0.0,
        pipeline_open_s=opens["pipeline_open_s"] if opens else 0.0,
        send_cost_s_per_gb=send_cost_s_per_gb if shared else 0.0,
        transfers_first=transfers_first and shared,
        serving_transfers_shared=serving_transfers_shared and transfers_first and shared,
        send_cpu_cores=min(send_cpu_cores, transfer_cores) if shared else 0.0,
        serving_receive_slowdown=serving_receive_slowdown
        if serving_transfers_shared and transfers_first and shared
        else 0.0,
        transfer_wakeups=transfer_wakeups and transfers_first and shared,
        serving_efficiency_in_transfers=efficiency_in_transfers if shared else 1.0,
        transfer_wakeups_queue=wakeups_queue and transfer_wakeups and transfers_first and shared,
    )
    trace = burst_trace(real["requests"], tuple(real["prompt_len"]), real["max_tokens"])
    recorder = Recorder()
    res = Simulation(trace, settings, system, timeline=recorder, host=host).run()
    opened = [
        round(ev.t_s, 3)
        for ev in recorder.events
        if isinstance(ev, InstanceUp | PipelineOpened) and ev.t_s > 0
    ]
    landed: dict[int, list[float]] = {}  # per block, when each receiver held it
    for ev in recorder.events:
        if isinstance(ev, BlockLanded) and ev.tier == "gpu" and ev.t_s > 0:
            landed.setdefault(ev.block, []).append(ev.t_s)
    ttft = [float(f - a) for f, a in zip(res.first_token_s, res.arrival_s, strict=True)]
    if min(ttft) < 0:
        raise RuntimeError(f"{mode}: some requests never got a first token")
    return {
        "ttft_p50_s": round(percentile(ttft, 0.5), 4),
        "ttft_p90_s": round(percentile(ttft, 0.9), 4),
        "ttft_max_s": round(max(ttft), 4),
        "all_requests_done_s": round(float(res.done_s.max()), 4),
        "pipelines_opened": sum(1 for e in res.scale_events if e[2] == "pipeline"),
        "endpoints_opened_s": opened,
        # per block, the first and the last receiver: the runtime's `block_landed_s`
        "block_landed_s": [
            [round(min(t), 4), round(max(t), 4)] if (t := landed.get(b)) else []
            for b in range(real["blocks"])
        ],
        # the last block landing: the runtime's `multicast_complete_s`
        "multicast_complete_s": round(
            max((ev.t_s for ev in recorder.events if isinstance(ev, BlockLanded)), default=0.0), 3
        ),
    }


FIXES = (
    "1_serving_step",
    "2_link_rate",  # the multicast's effective link rate
    "3_transfer_cpu",  # transfer CPU under shared_cores
    "4_pipeline_capacity",  # pipeline micro-batches
    "5_endpoint_open",  # the measured endpoint-opening costs
    "6_pipeline_speed",  # the measured pipeline speed
    "7_send_cost",  # sending slows the sender's serving
    "8_transfers_first",  # transfers take their CPU before serving
    "9_serving_transfers",  # a serving agent's transfers at its share
    "10_transfer_cpu_serving",  # the transfer CPU measured while K hot instances serve
    "11_serving_receive",  # blocks into a serving agent at their measured slow-down
    "12_transfer_wakeups",  # the transfers' CPU as wake-ups holding whole cores
    "13_burst_shape_fit",  # the serving step's costs fitted at the burst's shapes
    "14_serving_efficiency",  # serving per core measured while transfers run
    "15_wakeups_queue",  # the wake-ups queue behind serving threads filling the cores
)
"""Each fix added to the previous ones; the last is the calibrated prediction."""


def predict(profile: dict, reals: dict, cores: float) -> dict:
    """Per scenario, the simulated burst with every fix added in turn (the last: the
    calibrated prediction), on `profile` (`profile_of`) and the bursts' settings per K."""
    engine, transport = profile["engine"], profile["transport"]
    # Fix 13's costs (older profiles without them: fix 13 is fix 12).
    shapes = profile.get("burst_shapes") or {
        "per_layer_s": engine["per_layer_s"],
        "pipeline_speed": profile["pipeline_speed"],
    }
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for rate in (reals[1]["link_gbps"], transport["multicast_effective_gbps"]):
            for shaped in (False, True):
                where = Path(tmp) / f"{rate}-{shaped}"
                where.mkdir(exist_ok=True)
                costs = engine | {"per_layer_s": shapes["per_layer_s"]} if shaped else engine
                files[rate, shaped] = sim_files(costs, reals[1]["nodes"], rate, where)
        for k, mode in SCENARIOS:
            steps = {}
            for n, label in enumerate(FIXES, start=1):
                # Fix n is in force with every fix before it.
                shaped = n >= 13
                rate = transport["multicast_effective_gbps"] if n >= 2 else reals[1]["link_gbps"]
                # Fix 10: the transfer CPU measured during a burst (without that
                # measurement in the rounds, fix 10 is fix 9).
                w = profile["transfer_cores"]
                if n >= 10 and profile.get("transfer_cores_serving") is not None:
                    w = profile["transfer_cores_serving"]
                speed = shapes["pipeline_speed"] if shaped else profile["pipeline_speed"]
                pred = simulate_burst(
                    *files[rate, shaped],
                    reals[k],
                    mode,
                    cores,
                    transfer_cores=w if n >= 3 else 0.0,
                    micro_batches=PIPELINE_MICRO_BATCHES if n >= 4 else 1,
                    stage_hop_s=engine["agent_round_trip_per_step_s"],
                    opens=profile if n >= 5 else None,
                    pipeline_speed=speed if n >= 6 else 1.0,
                    send_cost_s_per_gb=profile["send_cost_s_per_gb"] if n >= 7 else 0.0,
                    transfers_first=n >= 8,
                    serving_transfers_shared=n >= 9,
                    send_cpu_cores=profile["send_cpu_cores"] if n >= 9 else 0.0,
                    # Fix 11: measured, or 0 (fix 9's share formula) where no round has it.
                    serving_receive_slowdown=(profile.get("serving_receive_slowdown") or 0.0)
                    if n >= 11
                    else 0.0,
                    transfer_wakeups=n >= 12,
                    # Fix 14: measured, or 1 (no loss) where no round has it.
                    efficiency_in_transfers=(
                        (profile.get("serving_efficiency_in_transfers") or 1.0) if n >= 14 else 1.0
                    ),
                    wakeups_queue=n >= 15,
                )
                steps[label] = {q: pred[q] for q in ("ttft_p50_s", "ttft_p90_s")}
            out[scenario_name(k, mode)] = {"predicted": pred, "predicted_by_fix": steps}
    return out
