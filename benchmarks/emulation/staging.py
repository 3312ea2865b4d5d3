"""What a system's run on the emulated cluster stands on: the real small model in a temporary
directory (`run_on_real_model`, over `real_model`), the agents emulating the benchmark's
cluster (`emulated_cluster`) and their copies as a scenario starts (`fresh_copies` before
each system's run, over `stage`, which `lambdascale_fig12.py` calls itself).

What flows: the benchmark's arguments and `EmulationConfig` in; a temporary directory
holding the model's store (`tmp/store`) and the registry that links it (`tmp/reg`), agents
reading that registry, and each system's fresh controller state directory out. The replay
on that cluster is `serving.py`'s. Owned by benchmarks/emulation/.
"""

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.common import make_cluster
from surge.emulation import Emulation, EmulationConfig
from surge.model.importer import import_checkpoint
from surge.model.manifest import Manifest, read_manifest
from surge.model.tiny import create_tiny_model
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.launch.local import LocalCluster
from surge.runtime.protocol import EvictOp, LoadOp, RegisterOp, StatusOp


def add_real_model_args(ap: argparse.ArgumentParser) -> None:
    """The flags `real_model` and `emulated_cluster` read besides the benchmark's own
    `--nodes`, `--max-prompt` and `--max-tokens`: each instance's batch limit and the real
    small model's layers and blocks."""
    ap.add_argument("--max-num-seqs", type=int, default=8, help="batch limit per instance")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=16)


def real_model(tmp: Path, args: argparse.Namespace) -> Manifest:
    """The real small model at `tmp/store` (the registry `tmp/reg` links it per run): a tiny
    Llama of `--layers` layers with room for `--max-prompt` + `--max-tokens`, cut into
    `--blocks` blocks."""
    cfg = TinyModelConfig(
        num_layers=args.layers,
        hidden_size=128,
        intermediate_size=344,
        max_position_embeddings=args.max_prompt + args.max_tokens + 64,
    )
    create_tiny_model(tmp / "hf", cfg)
    import_checkpoint(tmp / "hf", tmp / "store", num_blocks=args.blocks, progress=False)
    (tmp / "reg").mkdir()
    return read_manifest(tmp / "store")


def emulated_cluster(args: argparse.Namespace, tmp: Path, emulation: Emulation) -> LocalCluster:
    """`--nodes` agents emulating the benchmark's cluster, reading the registry `tmp/reg`."""
    return make_cluster(
        args,
        num_nodes=args.nodes,
        max_num_seqs=args.max_num_seqs,
        remote_dir=tmp / "reg",
        emulation=emulation,
        start_timeout_s=600.0,  # agents importing torch on two shared cores
    )


def link_store(tmp: Path, name: str) -> None:
    """The registry's copy of the store, as the controller makes it (a deletion unlinks it)."""
    link = tmp / "reg" / name
    if not link.is_symlink():
        link.symlink_to(tmp / "store", target_is_directory=True)


async def fresh_copies(
    cluster: LocalCluster,
    tmp: Path,
    name: str,
    manifest: Manifest,
    run: str,
    disk_nodes: list[int],
    host_nodes: list[int],
) -> tuple[Path, float]:
    """Before one system's run: the registry's copy back, the agents' copies staged
    (`stage`), and a fresh controller state directory `tmp/state-RUN` reading that
    registry. Returns the state directory and the real seconds staging took."""
    link_store(tmp, name)
    staging_s = await stage(cluster, name, manifest, disk_nodes, host_nodes)
    state = tmp / f"state-{run}"
    state.mkdir()
    (state / "registry").symlink_to(tmp / "reg")
    return state, staging_s


def run_on_real_model(
    args: argparse.Namespace,
    config: EmulationConfig,
    run: Callable[[Path, Manifest, Emulation], Awaitable[Any]],
) -> tuple[Any, int]:
    """`run(tmp, manifest, emulation)` in a temporary directory holding the real small
    model (`real_model`; `args.store` is its path), emulating `config`. Returns what it
    returned and the real model's bytes."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        manifest = real_model(tmp, args)
        args.store = tmp / "store"
        emulation = Emulation.for_store(config, manifest)
        return asyncio.run(run(tmp, manifest, emulation)), manifest.total_bytes


async def stage(
    cluster: LocalCluster,
    name: str,
    manifest: Manifest,
    disk_nodes: list[int],
    host_nodes: list[int],
) -> float:
    """Agents' copies as a scenario starts: no GPU or host copy anywhere, then the whole
    model on the disk of `disk_nodes` and in the host memory of `host_nodes`, each read
    from the registry at its emulated rate (in parallel: every agent has its own registry
    link). Returns the real seconds it took."""
    t0 = time.monotonic()
    client = cluster.client()
    await client.connect()
    blocks = tuple(range(manifest.num_blocks))
    try:
        nodes = sorted(cluster.addresses)
        await client.broadcast(RegisterOp(model=name, manifest=manifest), nodes)
        held = await client.broadcast(StatusOp(), nodes)

        async def one(node: int) -> None:
            for tier in ("gpu", "host"):
                await client.call(node, EvictOp(model=name, blocks=blocks, tier=tier))
            holding = held[node].models.get(name)
            on_disk = holding is not None and len(holding.disk) == len(blocks)
            if node in disk_nodes and not on_disk:
                await client.call(node, LoadOp(name, blocks, tier="disk", source="remote"))
            if node in host_nodes:
                await client.call(node, LoadOp(name, blocks, tier="host", source="remote"))

        await asyncio.gather(*(one(n) for n in nodes))
    finally:
        await client.close()
    return time.monotonic() - t0
