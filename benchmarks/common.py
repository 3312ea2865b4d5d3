"""Pieces the runtime benchmarks share: model shapes of a chosen size, seeding an
agent's disk tier with a store without copying it, and the cluster to run on
(`--cluster loopback`: agents on 127.0.0.1 with token-bucket caps; `--cluster netns`: agents
in network namespaces with tc-shaped links and a CPU quota each, see docs/testbed.md), and
where a run's CPU goes (`cpu_s`, `cores_during`: per process, from /proc), and which code a
run measured (`code_version`)."""

import argparse
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from surge.emulation import Emulation, EmulationConfig
from surge.model.manifest import Manifest
from surge.model.tiny_shape import TinyModelConfig
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig


def code_version() -> dict[str, Any]:
    """The commit a run measured and whether `surge/` differed from it (a result written in
    several sittings says per run which code it came from); None where git is absent."""
    root = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *cmd], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    changes = git("status", "--porcelain", "--", "surge")
    return {
        "commit": git("rev-parse", "--short=7", "HEAD"),
        "surge_modified": None if changes is None else bool(changes),
    }


def add_cluster_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cluster", choices=("loopback", "netns"), default="loopback")
    ap.add_argument(
        "--emulate",
        default=None,
        metavar="PRESET:MODEL",
        help="GPU-time emulation (docs/emulation.md): agents paced as MODEL on PRESET's GPUs "
        "and links, rates scaled by the benchmark's store; times stay real seconds",
    )
    ap.add_argument(
        "--time-dilation", type=float, default=1.0, help="with --emulate: real s per emulated s"
    )
    ap.add_argument(
        "--cpu-per-node",
        type=float,
        default=None,
        help="netns: CPU quota of each node in cores (default: this machine's cores / nodes; "
        "0: none)",
    )


def make_cluster(args: argparse.Namespace, **config: Any) -> LocalCluster:
    """A `LocalCluster` or, with `--cluster netns`, a `NetnsCluster` (same surface)."""
    if args.cluster == "netns":
        from surge.runtime.launch.netns_cluster import NetnsCluster, NetnsClusterConfig

        return NetnsCluster(NetnsClusterConfig(cpu_cores_per_node=args.cpu_per_node, **config))
    return LocalCluster(LocalClusterConfig(**config))


def emulation_of(args: argparse.Namespace, manifest: Manifest) -> Emulation | None:
    """The `--emulate` / `--time-dilation` setting over the benchmark's store (None: off)."""
    if getattr(args, "emulate", None) is None:
        return None
    return Emulation.for_store(EmulationConfig.parse(args.emulate, args.time_dilation), manifest)


def machine(args: argparse.Namespace, cluster: LocalCluster | None = None) -> dict:
    """Where a benchmark ran: the machine and the emulated cluster's settings."""
    out: dict[str, Any] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cluster": args.cluster,
    }
    if getattr(args, "emulate", None) is not None:
        out["emulate"] = args.emulate
        out["time_dilation"] = args.time_dilation
    if args.cluster == "netns":  # a netns cluster's links are the kernel's, made or not yet
        if cluster is not None:
            out["cpu_cores_per_node"] = cluster.cores_per_node  # type: ignore[attr-defined]
        out["links"] = "tc htb on each veth (egress: node end, ingress: bridge end)"
    else:
        out["links"] = "user-space token buckets on loopback"
    return out


def model_config(model_mb: float, num_layers: int) -> TinyModelConfig:
    """A Llama shape of about `model_mb` MB in float32 with `num_layers` layers."""
    hidden, vocab = 256, 512  # a small vocabulary keeps the first and last blocks close in size
    fixed = 2 * vocab * hidden + hidden
    per_layer_target = (model_mb * 1e6 / 4 - fixed) / num_layers
    attn = 3 * hidden * hidden  # q (256x256), k and v (128x256 each), o (256x256)
    inter = max(64, int((per_layer_target - attn - 2 * hidden) / (3 * hidden)))
    return TinyModelConfig(
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=inter,
        vocab_size=vocab,
    )


def registry_model(tmp: Path, cfg: TinyModelConfig, num_blocks: int) -> Manifest:
    """A tiny checkpoint of shape `cfg` made under `tmp/hf` and imported as the registry's
    model `m` (`tmp/reg/m`, `num_blocks` blocks); its manifest."""
    from surge.model.importer import import_checkpoint
    from surge.model.manifest import read_manifest
    from surge.model.tiny import create_tiny_model

    create_tiny_model(tmp / "hf", cfg)
    import_checkpoint(tmp / "hf", tmp / "reg" / "m", num_blocks=num_blocks, progress=False)
    return read_manifest(tmp / "reg" / "m")


def burst_cluster_config(
    num_nodes: int, link_gbps: float, max_num_seqs: int, tmp: Path
) -> LocalClusterConfig:
    """The calibration steps' cluster: the burst's link cap and batch, its KV budget, the
    registry `registry_model` made under `tmp`."""
    return LocalClusterConfig(
        num_nodes=num_nodes,
        link_gbps=link_gbps,
        max_num_seqs=max_num_seqs,
        max_kv_tokens=2048,
        remote_dir=tmp / "reg",
    )


def seed_disk(
    cluster: LocalCluster, node: int, model: str, store: Path, manifest: Manifest
) -> None:
    """Make `store`'s blocks appear in `node`'s disk tier as `model` (symlinks, no copies)."""
    dst = cluster.work_dir / f"node{node}" / model
    dst.mkdir(parents=True)
    for blk in manifest.blocks:
        (dst / blk.file).symlink_to(store / blk.file)


def cpu_s(pids: dict[int, int]) -> dict[int, float]:
    """CPU seconds (user + system) each process has used so far, from /proc (Linux); a
    process that is gone or unreadable is left out."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for node, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[node] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def cores_during(
    before: tuple[float, dict[int, float]], after: tuple[float, dict[int, float]], wall_s: float
) -> dict:
    """Cores the controller process (its router, the scale-out, the load client: one
    process) and each agent used over `wall_s`: where a burst's CPU goes on shared cores."""
    agents = {n: (after[1][n] - before[1][n]) / wall_s for n in after[1] if n in before[1]}
    return {
        "controller_and_client": round((after[0] - before[0]) / wall_s, 3),
        "agents": {n: round(c, 3) for n, c in sorted(agents.items())},
        "agents_total": round(sum(agents.values()), 3),
    }
