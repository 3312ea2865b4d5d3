"""Tiny simulator inputs for tests: a one-GPU-per-node cluster with measured per-layer costs
(0.01 s per layer and step), a 10-layer model, and a λScale burst on them (1 warm instance,
everything at t=0, scale-out at once). Used by tests/sim and tests/sim_calibrate."""

import json
from pathlib import Path

from surge.policy.systems import SystemConfig, system_config
from surge.sim.settings import SimSettings


def cluster_file(tmp_path: Path, nodes: int) -> str:
    gpu = {
        "name": "measured", "memory_gib": 8, "tflops": 1, "mem_bandwidth_gbs": 1,
        "prefill_efficiency": 1, "decode_efficiency": 1, "layer_overhead_s": 0,
        "measured_layer_costs_s": [0.01, 0.0, 0.01, 0.0],
    }  # fmt: skip
    group = {
        "num_nodes": nodes, "gpu": gpu, "gpus_per_node": 1, "nic_gbps": 10,
        "intra_gpu_gbps": 100, "pcie_gbps": 100, "ssd_gbps": 10, "host_memory_gib": 16,
    }  # fmt: skip
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"groups": [group]}))
    return str(path)


def model_file(tmp_path: Path) -> Path:
    """A 10-layer model file (with `_cluster`'s costs: 0.1 s per step)."""
    model = tmp_path / "tiny.json"
    model.write_text(
        json.dumps(
            {"name": "tiny", "num_layers": 10, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
             "context_tokens": 512, "dtype_bytes": 4}
        )
    )  # fmt: skip
    return model


def burst_sim(
    tmp_path: Path, nodes: int, nic_gbps: float, serve: str, **settings_kw: object
) -> tuple[SimSettings, SystemConfig]:
    """A calibrate-style burst: 1 warm instance, everything at t=0, scale-out at once
    (`settings_kw`: more `SimSettings` fields)."""
    from dataclasses import replace

    from surge.policy.autoscale_settings import AutoscaleSettings

    path = cluster_file(tmp_path, nodes)
    cluster = json.loads(Path(path).read_text())
    cluster["groups"][0]["nic_gbps"] = nic_gbps
    Path(path).write_text(json.dumps(cluster))
    model = model_file(tmp_path)
    system = replace(
        system_config("lambdascale"), name="ls", max_sources=1, num_blocks=4,
        serve_while_loading=serve, host_cache="none", decision_interval_s=1e-3,
        autoscale=AutoscaleSettings(target_ongoing_requests=1, downscale_delay_s=60),
    )  # fmt: skip
    settings = SimSettings(
        path, (str(model),), "ls", max_batch=1, warm_instances=1, **settings_kw
    )  # fmt: skip
    return settings, system
