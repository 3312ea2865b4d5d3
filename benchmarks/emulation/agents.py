"""What the emulation benchmarks share about the emulated cluster: the real small model cut
into the plan's blocks (`real_model`), the preset shrunk to the agents' GPUs
(`shrunk_cluster`, the simulator's side of the same cluster) and each agent's paced steps
and violations (`violations`). Used by `lambdascale.py`, `lambdascale_fig12.py`,
`lambdascale_blocks.py`, `paraserve.py`, `blitzscale.py`, `flexpipe.py`, `flexpipe_fig11.py`
and `serving.py`.
"""

from pathlib import Path

from benchmarks.scaleout.burst_run import MODEL
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.launch.local import LocalCluster
from surge.runtime.protocol import StatusOp
from surge.sim.hardware import ClusterProfile, cluster_from_spec, cluster_spec


def real_model(tmp: Path, layers: int, blocks: int) -> Manifest:
    """The real small model: a tiny Llama of `layers` layers (one per block keeps each
    paced step short), cut into the plan's block count, each padded to the largest
    (`equal_blocks`: on every link, tc's and a gloo group's too, one emulated block)."""
    cfg = TinyModelConfig(num_layers=layers, hidden_size=128, intermediate_size=344)
    create_tiny_model(tmp / "hf", cfg)
    store = tmp / "reg" / MODEL
    import_checkpoint(tmp / "hf", store, num_blocks=blocks, progress=False, equal_blocks=True)
    return read_manifest(store)


async def violations(cluster: LocalCluster) -> dict:
    """Each agent's paced steps and violations (cumulative over the cluster's life)."""
    client = cluster.client()
    await client.connect()
    try:
        out = {}
        for node in sorted(cluster.addresses):
            st = await client.call(node, StatusOp())
            out[node] = [
                st.emulated_steps,
                st.emulation_violations,
                round(st.emulation_overrun_s, 4),
            ]
        return out
    finally:
        await client.close()


def shrunk_cluster(preset: str, nodes: int) -> ClusterProfile:
    """The preset's machines holding its first `nodes` GPUs, as the emulation takes them."""
    spec = cluster_spec(preset)
    groups, left = [], nodes
    for g in spec["groups"]:
        per = g["gpus_per_node"]
        machines = min(g["num_nodes"], -(-left // per))
        if machines > 0:
            groups.append({**g, "num_nodes": machines})
            left -= machines * per
    return cluster_from_spec(preset, {"groups": groups})
