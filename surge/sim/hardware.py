"""Hardware profiles: GPUs and cluster presets, read from data files.

In: `profiles/gpus.json`, `profiles/clusters.json` (package data) or a user JSON file
with the same shape as one cluster preset. Out: validated `GpuProfile` and
`ClusterProfile` dataclasses; a cluster is node groups expanded into `Machine`s.
Units: Gb/s for links (1e9 bit/s), bytes for memory. Capacities in the files are in the
unit they are sold in, named in the key: GPU HBM and host DRAM in GiB (2**30 B: a "32 GB"
V100 holds 32 GiB = 34.36e9 B, and the papers size models in GiB, e.g. ParaServe Table 1's
"24.2GB" Llama-2 13B is 26.0e9 B), disks in GB (1e9 B, as drives are sold).
"""

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from surge.errors import SurgeError

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
GB = 1_000_000_000
"""Bytes in a GB (disks; links are Gb/s = 1e9 bit/s)."""
GIB = 1 << 30
"""Bytes in a GiB (GPU HBM and host DRAM, as sold and as the papers count them)."""
RENAMED_KEYS = {"memory_gb": "memory_gib", "host_memory_gb": "host_memory_gib"}
"""Old keys (1e9 B) and their replacements (2**30 B): an old key is refused, not read, so
that no file silently changes what its number means."""


def gib_bytes(gib: float) -> int:
    """`gib` GiB in bytes (the one conversion of every memory capacity in the profiles)."""
    return int(float(gib) * GIB)


def refuse_renamed(d: dict, where: str) -> None:
    """A profile or override that still uses a renamed key: say which key replaces it."""
    for old, new in RENAMED_KEYS.items():
        if old in d:
            raise SurgeError(
                f"{where}: {old!r} (GB = 1e9 B) is now {new!r} (GiB = 2**30 B, as memory "
                f"is sold): rename it and state the capacity in GiB"
            )


@cache
def load_json(name: str) -> dict:
    return json.loads((PROFILES_DIR / name).read_text())


@dataclass(frozen=True)
class GpuProfile:
    """One GPU type and the constants of its per-layer cost model (see costs.py)."""

    name: str
    """GPU type, e.g. H800."""
    memory_bytes: int
    """HBM capacity (the profile states it in GiB)."""
    tflops: float
    """Dense fp16/bf16 tensor peak, TFLOP/s."""
    mem_bandwidth_gbs: float
    """HBM bandwidth, GB/s."""
    prefill_efficiency: float
    """Fraction of peak FLOP/s reached by prefill and by the per-token part of decode."""
    decode_efficiency: float
    """Fraction of HBM bandwidth reached when decode streams a layer's weights."""
    layer_overhead_s: float
    """Fixed cost per layer per forward step (kernel launches)."""
    measured_layer_costs_s: tuple[float, float, float, float] | None = None
    """Measured per-layer (prefill_fixed, prefill_per_token, decode_fixed, decode_per_seq)
    seconds of ONE model on this device (a calibration, `benchmarks/sim_calibrate/main.py`);
    when set they replace the roofline of costs.py (tensor parallel 1 only)."""

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.tflops <= 0 or self.mem_bandwidth_gbs <= 0:
            raise SurgeError(f"GPU {self.name}: memory, tflops, bandwidth must be > 0")
        for f in (self.prefill_efficiency, self.decode_efficiency):
            if not 0 < f <= 1:
                raise SurgeError(f"GPU {self.name}: efficiencies must be in (0, 1]")
        if self.layer_overhead_s < 0:
            raise SurgeError(f"GPU {self.name}: layer_overhead_s must be >= 0")
        costs = self.measured_layer_costs_s
        if costs is not None and (len(costs) != 4 or min(costs) < 0 or costs[0] + costs[1] <= 0):
            raise SurgeError(f"GPU {self.name}: measured_layer_costs_s needs 4 values >= 0")


def gpu_profile(name: str | dict) -> GpuProfile:
    """The GPU named `name` from gpus.json, or an inline profile: a dict with the fields
    of one gpus.json entry plus `name` (and optionally `measured_layer_costs_s`)."""
    if isinstance(name, dict):
        d = name
        name = str(d.get("name", "inline"))
    else:
        table = load_json("gpus.json")
        if name not in table or name.startswith("_"):
            known = ", ".join(k for k in table if not k.startswith("_"))
            raise SurgeError(f"unknown GPU {name!r}; choose one of {known}")
        d = table[name]
    refuse_renamed(d, f"GPU {name}")
    try:
        return _gpu(name, d)
    except KeyError as e:
        raise SurgeError(f"GPU {name}: profile lacks field {e.args[0]}") from None


def _gpu(name: str, d: dict) -> GpuProfile:
    measured = d.get("measured_layer_costs_s")
    return GpuProfile(
        name,
        gib_bytes(d["memory_gib"]),
        float(d["tflops"]),
        float(d["mem_bandwidth_gbs"]),
        float(d["prefill_efficiency"]),
        float(d["decode_efficiency"]),
        float(d["layer_overhead_s"]),
        None if measured is None else tuple(float(x) for x in measured),
    )


@dataclass(frozen=True)
class NodeGroup:
    """`num_nodes` identical machines."""

    num_nodes: int
    """How many machines of this kind."""
    gpu: GpuProfile
    """Their GPU type."""
    gpus_per_node: int
    """GPUs in each machine."""
    nic_gbps: float
    """Network bandwidth of the machine (each direction), shared by its GPUs."""
    gpu_nic_gbps: float | None
    """Per-GPU RDMA NIC (each direction); None: GPUs use only the machine NIC."""
    intra_gpu_gbps: float
    """GPU-to-GPU bandwidth inside the machine (NVLink or PCIe peer-to-peer)."""
    nvlink: bool
    """Whether the intra-machine GPU links are NVLink (tensor parallel across them)."""
    pcie_gbps: float
    """Host memory -> one GPU."""
    ssd_gbps: float
    """Local SSD read bandwidth of the machine."""
    registry_gbps: float | None
    """Remote registry -> this machine cap; None: limited by the NIC only."""
    host_memory_bytes: int
    """Host memory of the machine (the profile states it in GiB)."""
    disk_bytes: int
    """Local disk of the machine (the profile states it in GB = 1e9 B)."""
    model_store: str = "ssd"
    """Where models live when not in memory: `ssd` (local disk) or `registry` (remote)."""
    ssd_gpu_gbps: float | None = None
    """SSD -> one GPU cap (BlitzScale Table 1's "SSD-GPU" row, §6.1: "a 10 Gbps per-GPU
    bandwidth"); None: only the machine's `ssd_gbps` bounds a GPU's SSD load."""

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise SurgeError("a node group needs >= 1 node and >= 1 GPU per node")
        for name in ("nic_gbps", "intra_gpu_gbps", "pcie_gbps", "ssd_gbps"):
            if not getattr(self, name) > 0:
                raise SurgeError(f"node group {name} must be > 0")
        for name in ("gpu_nic_gbps", "registry_gbps", "ssd_gpu_gbps"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SurgeError(f"node group {name} must be > 0 or null")
        if self.model_store not in ("ssd", "registry"):
            raise SurgeError("node group model_store must be 'ssd' or 'registry'")
        if self.host_memory_bytes <= 0 or self.disk_bytes < 0:
            raise SurgeError("node group memory must be > 0 and disk >= 0")


@dataclass(frozen=True)
class Machine:
    """One machine of the cluster, with global GPU ids."""

    index: int
    """Machine number, 0..M-1."""
    group: NodeGroup
    """Its hardware."""
    first_gpu: int
    """Global id of its first GPU; its GPUs are first_gpu .. first_gpu + gpus_per_node - 1."""

    @property
    def gpu_ids(self) -> range:
        """Global ids of its GPUs."""
        return range(self.first_gpu, self.first_gpu + self.group.gpus_per_node)


@dataclass(frozen=True)
class ClusterProfile:
    """A cluster: machines in node-group order."""

    name: str
    """Preset name or file path."""
    groups: tuple[NodeGroup, ...]
    """Node groups in order."""

    def __post_init__(self) -> None:
        if not self.groups:
            raise SurgeError(f"cluster {self.name} has no node groups")

    @property
    def machines(self) -> tuple[Machine, ...]:
        """Every machine, numbered in group order."""
        out: list[Machine] = []
        gpu = 0
        for group in self.groups:
            for _ in range(group.num_nodes):
                out.append(Machine(len(out), group, gpu))
                gpu += group.gpus_per_node
        return tuple(out)

    @property
    def num_gpus(self) -> int:
        """GPUs in the whole cluster."""
        return sum(g.num_nodes * g.gpus_per_node for g in self.groups)


def _group(d: dict, where: str) -> NodeGroup:
    refuse_renamed(d, where)
    try:
        return NodeGroup(
            int(d["num_nodes"]),
            gpu_profile(d["gpu"] if isinstance(d["gpu"], dict) else str(d["gpu"])),
            int(d["gpus_per_node"]),
            float(d["nic_gbps"]),
            None if d.get("gpu_nic_gbps") is None else float(d["gpu_nic_gbps"]),
            float(d["intra_gpu_gbps"]),
            bool(d.get("nvlink", False)),
            float(d["pcie_gbps"]),
            float(d["ssd_gbps"]),
            None if d.get("registry_gbps") is None else float(d["registry_gbps"]),
            gib_bytes(d["host_memory_gib"]),
            int(float(d.get("disk_gb", 0)) * GB),
            str(d.get("model_store", "ssd")),
            None if d.get("ssd_gpu_gbps") is None else float(d["ssd_gpu_gbps"]),
        )
    except KeyError as e:
        raise SurgeError(f"{where}: node group lacks field {e.args[0]}") from None
    except (TypeError, ValueError) as e:
        raise SurgeError(f"{where}: bad node group value ({e})") from None


def cluster_presets() -> tuple[str, ...]:
    """Names of the bundled cluster presets."""
    return tuple(k for k in load_json("clusters.json") if not k.startswith("_"))


def cluster_spec(name_or_file: str) -> dict:
    """The JSON of a bundled preset by name, or of a JSON file shaped like one preset."""
    table = load_json("clusters.json")
    if name_or_file in table and not name_or_file.startswith("_"):
        spec = table[name_or_file]
    else:
        path = Path(name_or_file)
        if not path.is_file():
            raise SurgeError(
                f"unknown cluster {name_or_file!r}; choose one of "
                f"{', '.join(cluster_presets())} or give a JSON file"
            )
        try:
            spec = json.loads(path.read_text())
        except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: nested too deep
            raise SurgeError(f"cluster file {path} is not valid JSON ({str(e)[:200]})") from None
    return spec


def cluster_from_spec(name: str, spec: object) -> ClusterProfile:
    """A cluster from the JSON shape of one preset (a dict with a `groups` list)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("groups"), list):
        raise SurgeError(f"cluster {name}: needs a 'groups' list of node groups")
    for g in spec["groups"]:
        if not isinstance(g, dict):
            raise SurgeError(f"cluster {name}: every node group must be an object")
    return ClusterProfile(name, tuple(_group(g, name) for g in spec["groups"]))


def load_cluster(name_or_file: str) -> ClusterProfile:
    """A bundled preset by name, or a JSON file shaped like one preset."""
    return cluster_from_spec(name_or_file, cluster_spec(name_or_file))
