"""The emulated cluster, node by node: which GPU and links each agent stands for, and the
real rates that make moving the real store take as long as moving the emulated model.

What flows: an `Emulation` (the settings and the real store's size) in; out, one
`EmulatedNode` per agent (the preset's machines in order, one agent per GPU, GPUs of one
machine a host group) and its rates scaled by `ByteScale`: every rate times real store
bytes / emulated model bytes, divided by the time dilation D. A block of the real store then
crosses a scaled link in D times what the emulated block takes on the emulated link. Read by
the launchers (`runtime/launch/local.py`, `netns_cluster.py`). Owned by emulation/.
"""

from dataclasses import dataclass

from surge.emulation.settings import EmulationConfig
from surge.errors import SurgeError
from surge.model.manifest import Manifest
from surge.sim.hardware import GIB, load_cluster
from surge.sim.models import ModelProfile


@dataclass(frozen=True)
class ByteScale:
    """Real bytes / emulated bytes and the time dilation: how an emulated rate becomes real."""

    weights_ratio: float
    """Real store bytes / emulated model bytes."""
    time_dilation: float
    """D (see `EmulationConfig.time_dilation`)."""

    def __post_init__(self) -> None:
        if not self.weights_ratio > 0 or not self.time_dilation > 0:
            raise SurgeError("a byte scale needs a ratio > 0 and a time dilation > 0")

    def gbps(self, emulated_gbps: float) -> float:
        """The real cap that moves the real store as fast as `emulated_gbps` moves the
        emulated model, D times slower."""
        return emulated_gbps * self.weights_ratio / self.time_dilation


@dataclass(frozen=True)
class EmulatedNode:
    """One agent's emulated hardware (Gbit/s as the preset states them, unscaled)."""

    node: int
    """Agent id."""
    machine: int
    """The preset machine holding this agent's GPU."""
    gpu: str
    """GPU type (a `gpus.json` entry)."""
    nic_gbps: float
    """This GPU's network share: its own RDMA NIC, else the machine NIC split evenly over the
    machine's GPUs (agents have one token bucket each; the sim shares the NIC as flows)."""
    host_gbps: float | None
    """GPU-to-GPU link inside the machine (None: the only GPU of its machine here)."""
    pcie_gbps: float
    """Host memory -> this GPU."""
    ssd_gbps: float
    """Local SSD read."""
    registry_gbps: float
    """The model registry as this node reads it (the preset's cap, else its NIC share)."""
    memory_bytes: int
    """GPU memory (the KV cache is what the emulated model leaves of it)."""


@dataclass(frozen=True)
class Emulation:
    """An `EmulationConfig` applied to a real store of `real_model_bytes`."""

    config: EmulationConfig
    real_model_bytes: int
    """Bytes of the real store the agents move (its manifest's total)."""
    real_kv_bytes_per_token: int = 1
    """The real model's KV cache per token, every layer (for `kv_budget_bytes`)."""

    def __post_init__(self) -> None:
        if self.real_model_bytes < 1 or self.real_kv_bytes_per_token < 1:
            raise SurgeError("an emulation needs the real store's size (bytes >= 1)")

    @staticmethod
    def for_store(config: EmulationConfig, manifest: Manifest) -> "Emulation":
        """`config` applied to the real store of `manifest`."""
        arch = manifest.arch
        kv = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * itemsize(arch.dtype)
        return Emulation(config, manifest.total_bytes, kv)

    @property
    def scale(self) -> ByteScale:
        return ByteScale(
            self.real_model_bytes / self.config.profile.total_bytes, self.config.time_dilation
        )

    def nodes(self, num_nodes: int | None = None) -> tuple[EmulatedNode, ...]:
        """The first `num_nodes` GPUs of the preset (None: all of them), one agent each."""
        cluster = load_cluster(self.config.preset)
        total = cluster.num_gpus
        n = total if num_nodes is None else num_nodes
        if not 1 <= n <= total:
            raise SurgeError(
                f"--nodes {n}: preset {self.config.preset} has {total} GPUs (one agent each); "
                f"give --nodes 1..{total}"
            )
        out: list[EmulatedNode] = []
        for machine in cluster.machines:
            g = machine.group
            share = g.gpu_nic_gbps or g.nic_gbps / g.gpus_per_node
            for _ in machine.gpu_ids:
                if len(out) == n:
                    break
                out.append(
                    EmulatedNode(
                        node=len(out),
                        machine=machine.index,
                        gpu=g.gpu.name,
                        nic_gbps=share,
                        host_gbps=g.intra_gpu_gbps if g.gpus_per_node > 1 else None,
                        pcie_gbps=g.pcie_gbps,
                        ssd_gbps=g.ssd_gbps,
                        registry_gbps=g.registry_gbps or share,
                        memory_bytes=g.gpu.memory_bytes,
                    )
                )
        model = self.config.profile
        for node in out:
            if model.total_bytes >= node.memory_bytes:
                raise SurgeError(
                    f"the emulation runs one GPU per agent: {model.name} "
                    f"({model.total_bytes / GIB:.0f} GiB) does not fit one {node.gpu} "
                    f"({node.memory_bytes / GIB:.0f} GiB) of {self.config.preset}; pick a "
                    "smaller model or a preset with larger GPUs"
                )
        return tuple(out)

    def host_groups(self, nodes: tuple[EmulatedNode, ...]) -> tuple[tuple[int, ...], ...]:
        """Agents whose GPUs share a machine (only groups of two or more)."""
        by_machine: dict[int, list[int]] = {}
        for node in nodes:
            by_machine.setdefault(node.machine, []).append(node.node)
        return tuple(tuple(g) for g in by_machine.values() if len(g) > 1)

    def kv_tokens(self, node: EmulatedNode) -> int:
        """KV-cache capacity of one runner: what the emulated model leaves of the emulated
        GPU, in the emulated model's bytes per token, clipped to `kv_budget_bytes` of the
        real model's cache (`emulated_kv_tokens` is the unclipped figure)."""
        budget = self.config.kv_budget_bytes // self.real_kv_bytes_per_token
        return max(1, min(self.emulated_kv_tokens(node), budget))

    def emulated_kv_tokens(self, node: EmulatedNode) -> int:
        """The emulated GPU's KV capacity before any clipping."""
        model = self.config.profile
        return (node.memory_bytes - model.total_bytes) // model.kv_bytes_per_token


@dataclass(frozen=True)
class TrafficCharges:
    """What one real byte of activations or of K/V costs on links scaled for the weights:
    their own real / emulated byte ratio differs from the weights' (a small model's hidden
    state is a far larger share of its weights than a 13B model's), so a frame of them is
    paced as `charge x` its bytes (`Connection.send`'s `pace`)."""

    hidden: float
    """Per real byte of hidden states (and logits) between pipeline stages."""
    kv: float
    """Per real byte of K/V (migration, P/D hand-off)."""


def itemsize(dtype: str) -> int:
    """Bytes per element of a store dtype."""
    return 2 if dtype in ("float16", "bfloat16") else 4


def traffic_charges(model: ModelProfile, manifest: Manifest) -> TrafficCharges:
    """The charges of the real store `manifest` standing for `model`: weights ratio over
    the hidden state's (per token) and the K/V's (per token, every layer) ratios."""
    arch = manifest.arch
    size = itemsize(arch.dtype)
    weights = manifest.total_bytes / model.total_bytes
    hidden = arch.hidden_size * size / (model.hidden_size * model.dtype_bytes)
    kv = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * size / model.kv_bytes_per_token
    return TrafficCharges(hidden=weights / hidden, kv=weights / kv)


def block_charges(manifest: Manifest) -> tuple[float, ...]:
    """What each byte of each block of the real store `manifest` costs on a paced link or
    tier: its mean block's bytes over its own. The emulated model moves in equal blocks
    (λScale §4.2's time steps, one block each; the simulator's `total / num_blocks` per
    block), while a small real store's blocks are layer ranges whose first and last also
    hold the embeddings and the head (a 16-layer tiny Llama's are 1.58x its mean block).
    Scaling every rate by the whole store's ratio alone makes such an end block last 1.58
    emulated blocks on every hop, so a multicast tree fills late by that much per level
    (λScale's K=2 first pipeline at 0.360 vs the simulator's 0.294 s). Charged so, every
    block moves in one emulated block's time and the store still in the model's."""
    sizes = [b.size_bytes for b in manifest.blocks]
    mean = sum(sizes) / len(sizes)
    return tuple(mean / s if s > 0 else 1.0 for s in sizes)
