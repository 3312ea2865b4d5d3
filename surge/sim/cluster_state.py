"""The simulated cluster's state: GPUs in use, links, host caches.

In: a `ClusterProfile` and the `FlowNetwork`. Out: free-GPU bookkeeping, the link paths
of every kind of transfer (GPU to GPU over the network or inside a machine, host
memory to GPU, host memory of one machine to a GPU of another (a host copy as a
multicast source, FaaScale §5), SSD or registry to GPU or to host memory (a cold
leader restoring the host copy)), and per-machine host caches holding
`surge.policy.copies.keepalive.CacheEntry`s.

Links per machine m: `nic-out/m`, `nic-in/m` (machine NIC), `ssd/m`, and per GPU g:
`pcie/g` (host -> GPU), `ssd-gpu/g` (SSD -> GPU cap, when the preset has one),
`gnic-out/g`, `gnic-in/g` (per-GPU RDMA NIC, when the preset has one; then GPU traffic
crosses it instead of the machine NIC), `intra/g` (GPU -> GPU inside the machine, into g).
`registry` is cluster-wide; a per-machine cap adds `reg/m`.
"""

from surge.policy.copies.keepalive import CacheEntry
from surge.sim.flows import FlowNetwork, Link
from surge.sim.hardware import ClusterProfile, Machine

REGISTRY_GBPS = 1e6
"""The remote registry itself is not the bottleneck (ParaServe §8.1)."""


class ClusterState:
    """Machines, GPUs and their links on one `FlowNetwork`."""

    def __init__(self, profile: ClusterProfile, net: FlowNetwork) -> None:
        self.profile = profile
        self.net = net
        self.machines: tuple[Machine, ...] = profile.machines
        self.machine_of_gpu: dict[int, Machine] = {}
        for m in self.machines:
            for g in m.gpu_ids:
                self.machine_of_gpu[g] = m
        self.free_gpus: set[int] = set(self.machine_of_gpu)
        """GPUs nobody holds any of (whole-GPU instances take only these)."""
        self.gpu_used: dict[int, float] = {}
        """Share held of each GPU that fractional workers share (ParaServe low-memory
        workers, `policy.paraserve.gpu_share`): neither free nor whole."""
        self.host_cache: list[dict[str, CacheEntry]] = [{} for _ in self.machines]
        self.cached_machines: set[int] = set()
        """Machines whose host cache holds something (kept by `sim.host_cache`, so the
        per-second sampler and expiry skip the empty ones of a 1,000-node cluster)."""
        self.registry = net.add_link("registry", REGISTRY_GBPS)
        for m in self.machines:
            grp = m.group
            net.add_link(f"nic-out/{m.index}", grp.nic_gbps)
            net.add_link(f"nic-in/{m.index}", grp.nic_gbps)
            net.add_link(f"ssd/{m.index}", grp.ssd_gbps)
            if grp.registry_gbps is not None:
                net.add_link(f"reg/{m.index}", grp.registry_gbps)
            for g in m.gpu_ids:
                net.add_link(f"pcie/{g}", grp.pcie_gbps)
                net.add_link(f"intra/{g}", grp.intra_gpu_gbps)
                if grp.ssd_gpu_gbps is not None:
                    net.add_link(f"ssd-gpu/{g}", grp.ssd_gpu_gbps)
                if grp.gpu_nic_gbps is not None:
                    net.add_link(f"gnic-out/{g}", grp.gpu_nic_gbps)
                    net.add_link(f"gnic-in/{g}", grp.gpu_nic_gbps)

    def _link(self, name: str) -> Link:
        return self.net.links[name]

    # --- paths --------------------------------------------------------------------
    def gpu_to_gpu(self, src: int, dst: int) -> tuple[Link, ...]:
        """Path of a GPU -> GPU transfer (intra-machine link or the network)."""
        ms, md = self.machine_of_gpu[src], self.machine_of_gpu[dst]
        if ms.index == md.index:
            return (self._link(f"intra/{dst}"),)
        if ms.group.gpu_nic_gbps is not None and md.group.gpu_nic_gbps is not None:
            return (self._link(f"gnic-out/{src}"), self._link(f"gnic-in/{dst}"))
        return (self._link(f"nic-out/{ms.index}"), self._link(f"nic-in/{md.index}"))

    def gpu_egress(self, gpu: int) -> str:
        """Name of the link `gpu`'s blocks leave its machine by (`gpu_to_gpu`): its own
        RDMA NIC where the preset has one, else the machine NIC."""
        m = self.machine_of_gpu[gpu]
        return f"gnic-out/{gpu}" if m.group.gpu_nic_gbps is not None else f"nic-out/{m.index}"

    def host_egress(self, machine: int) -> str:
        """Name of the link a host copy's blocks leave `machine` by (`host_to_remote_gpu`)."""
        return f"nic-out/{machine}"

    def agent_links(self, gpu: int) -> tuple[tuple[Link, ...], tuple[Link, ...]]:
        """The network links `gpu`'s node agent sends (egress) and receives (ingress)
        blocks through."""
        m = self.machine_of_gpu[gpu]
        out = (f"gnic-out/{gpu}", f"nic-out/{m.index}")
        into = (f"gnic-in/{gpu}", f"nic-in/{m.index}")
        return tuple(self.net.links[n] for n in out if n in self.net.links), tuple(
            self.net.links[n] for n in into if n in self.net.links
        )

    def host_to_gpu(self, gpu: int) -> tuple[Link, ...]:
        """Path from host memory to `gpu`."""
        return (self._link(f"pcie/{gpu}"),)

    def host_to_remote_gpu(self, machine: int, gpu: int) -> tuple[Link, ...]:
        """Path from host memory of `machine` to `gpu` (a host source's block): over the
        PCIe link inside the machine, else out of the machine NIC (host memory is not
        behind a GPU's own NIC) and in through the receiver's network link."""
        md = self.machine_of_gpu[gpu]
        if md.index == machine:
            return self.host_to_gpu(gpu)
        inbound = f"gnic-in/{gpu}" if md.group.gpu_nic_gbps is not None else f"nic-in/{md.index}"
        return (self._link(f"nic-out/{machine}"), self._link(inbound))

    def store_to_host(self, machine: int, store: str) -> tuple[Link, ...]:
        """Path from the model store (`ssd` or `registry`) into host memory of `machine`."""
        if store == "ssd":
            return (self._link(f"ssd/{machine}"),)
        path = [self.registry, self._link(f"nic-in/{machine}")]
        if self.machines[machine].group.registry_gbps is not None:
            path.insert(1, self._link(f"reg/{machine}"))
        return tuple(path)

    def ssd_to_gpu(self, gpu: int) -> tuple[Link, ...]:
        """Path from the machine's SSD to `gpu` (through its own SSD-GPU cap, when the
        preset states one)."""
        m = self.machine_of_gpu[gpu]
        path = [self._link(f"ssd/{m.index}"), self._link(f"pcie/{gpu}")]
        if m.group.ssd_gpu_gbps is not None:
            path.insert(1, self._link(f"ssd-gpu/{gpu}"))
        return tuple(path)

    def registry_to_gpu(self, gpu: int) -> tuple[Link, ...]:
        """Path from the remote registry to `gpu` (over the machine NIC)."""
        m = self.machine_of_gpu[gpu]
        path = [self.registry, self._link(f"nic-in/{m.index}"), self._link(f"pcie/{gpu}")]
        if m.group.registry_gbps is not None:
            path.insert(1, self._link(f"reg/{m.index}"))
        return tuple(path)

    def store_to_gpu(self, gpu: int, store: str) -> tuple[Link, ...]:
        """Path from the model store (`ssd` or `registry`) to `gpu`."""
        return self.ssd_to_gpu(gpu) if store == "ssd" else self.registry_to_gpu(gpu)

    # --- views --------------------------------------------------------------------
    def network_gbps(self, gpu: int) -> float:
        """Network bandwidth one GPU can send or receive at."""
        grp = self.machine_of_gpu[gpu].group
        return grp.gpu_nic_gbps if grp.gpu_nic_gbps is not None else grp.nic_gbps

    def host_network_gbps(self, machine: int) -> float:
        """Network bandwidth a host source on `machine` sends at (its machine NIC)."""
        return self.machines[machine].group.nic_gbps

    def fetch_gbps(self, machine: int) -> float:
        """Bandwidth one worker on `machine` fetches from the model store at."""
        grp = self.machines[machine].group
        if grp.model_store == "ssd":
            return grp.ssd_gbps
        return min(grp.nic_gbps, grp.registry_gbps or grp.nic_gbps)

    def nic_load(self, machine: int) -> int:
        """Flows on the machine's NIC (both directions)."""
        return len(self._link(f"nic-in/{machine}").flows) + len(
            self._link(f"nic-out/{machine}").flows
        )

    def free_on(self, machine: Machine) -> tuple[int, ...]:
        """Free GPU ids of `machine`, ascending."""
        return tuple(g for g in machine.gpu_ids if g in self.free_gpus)

    def has_free(self, machine: Machine) -> bool:
        """Whether `machine` has a free GPU (`free_on` is not empty)."""
        return not self.free_gpus.isdisjoint(machine.gpu_ids)

    def free_shares_on(self, machine: Machine) -> tuple[tuple[int, float], ...]:
        """(GPU id, free share) of every GPU of `machine` with any of it free, ascending:
        1.0 for a free GPU, the unheld rest of a shared one."""
        out = []
        for g in machine.gpu_ids:
            if g in self.free_gpus:
                out.append((g, 1.0))
            elif g in self.gpu_used:
                out.append((g, 1.0 - self.gpu_used[g]))
        return tuple(out)

    def host_cache_bytes(self) -> int:
        """Bytes of models in host caches, whole cluster."""
        return sum(e.size_bytes for m in self.cached_machines for e in self.host_cache[m].values())
