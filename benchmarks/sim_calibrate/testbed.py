"""The CPU testbed's host model: one machine's cores shared by every agent, fitted fix by fix.

In: the fields below (measured by this folder's benchmarks: `main.py`, `send.py`,
`receive.py`, `serving.py`, `wakeup_queue.py`, `sim_calibration.json`). Out: a
`surge.sim.host.HostFactory` (`TestbedHost` is callable on a simulator's `World`) that
builds a `compute_sharing.ComputeSharing`, passed as `Simulation(..., host=TestbedHost(...))`.

Why it lives here and not in `surge.sim.SimSettings` (issue 31): the product simulator
models GPU clusters, where a node's time is its GPU's; under GPU-time emulation the
runtime's agents are paced to the emulated GPU too (docs/emulation.md). These fields (the
"fix N" steps of `main.py`, fitted to 8 agents on this machine's 2 cores) describe only
that CPU testbed, and no paper profile or `surge simulate` run ever set them.
"""

from dataclasses import dataclass

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing
from surge.errors import SurgeError
from surge.sim.world import World


@dataclass(frozen=True)
class TestbedHost:
    """How the testbed's shared cores slow serving, transfers and openings (all off by
    default: a `TestbedHost()` is a real cluster, as `surge.sim.host.DedicatedHost`)."""

    __test__ = False  # not a pytest class, whatever its name

    shared_cores: float | None = None
    """Host compute sharing: every instance and execution pipeline of the cluster runs on
    ONE host with this many cores (e.g. local agents on one machine, one thread each).
    Busy endpoints share them equally, each getting at most one core: with n busy, each
    runs at min(1, shared_cores / n) of its cost model's speed. None: every GPU computes
    on its own (a real cluster)."""
    transfer_cores: float = 0.0
    """With `shared_cores`: cores one multicast block transfer in flight takes from that
    host (framing, receive, crc32 verify; sender and receiver together). Every consumer
    then runs at min(1, shared_cores / (busy endpoints + transfer_cores * transfers)) of
    its speed: endpoints' steps and every flow on the network alike."""
    transfers_first: bool = False
    """With `shared_cores`: block transfers take their CPU ahead of serving instead of an
    equal share: flows run at min(1, shared_cores / (transfer_cores * transfers)) and the
    busy endpoints share what is left. Why: the agents that move blocks are I/O-bound (they
    sleep on sockets and wake for each chunk), and Linux's scheduler runs a task waking from
    I/O ahead of CPU-bound ones; measured, the runtime's multicast barely slows while hot
    instances serve (`benchmarks/sim_calibrate/main.py`, fix 8). False: one equal share for all."""
    serving_transfers_shared: bool = False
    """With `transfers_first`: at a node whose agent also serves (a busy endpoint on its
    GPU) a block's CPU work runs at that endpoint's share, so its NIC links move blocks at
    1 / (1 + e * (1/share - 1)), e the cores that end's work takes at full rate
    (`send_cpu_cores` out, `transfer_cores - send_cpu_cores` in):
    `compute_sharing.py`, `benchmarks/sim_calibrate/main.py` fix 9. False: every transfer
    goes first."""
    send_cpu_cores: float = 0.0
    """Of `transfer_cores`, the cores the SENDER's agent spends per block transfer at the
    link's full rate (measured: `benchmarks/sim_calibrate/send.py`, CPU seconds per GB
    sent x the link's GB/s); used by `serving_transfers_shared`."""
    serving_receive_slowdown: float = 0.0
    """With `serving_transfers_shared`: how many times longer a block takes to land in an
    agent that serves than in one that does not, MEASURED (`benchmarks/sim_calibrate/receive.py`:
    the same blocks into a serving and an idle agent at once, while hot instances saturate
    the host); a serving node's ingress links then move at 1 / this of their rate instead of
    the share formula's receiver end (`compute_sharing.py`, fix 11).
    0 (the default): the share formula. Otherwise at least 1."""
    transfer_wakeups: bool = False
    """With `transfers_first`: the transfers' CPU comes as short wake-ups that each hold a
    whole core while they run (ahead of serving), so the busy endpoints get the cores those
    wake-ups leave at each instant (an M/M/c queue's idle servers: `compute_sharing.py`
    `wakeup_share`), not the fluid `cores - transfer demand`. Differs only while fewer
    endpoints are busy than there are cores: a lone hot source loses part of its core even
    though the host has idle capacity (measured: `benchmarks/sim_calibrate/serving.py`,
    fix 12). False: the fluid share."""
    transfer_wakeups_queue: bool = False
    """With `transfer_wakeups`: when the busy endpoints (one serving thread's core each; a
    pipeline counts once) and the transfers' CPU want more cores than the host has, the
    transfers' wake-ups no longer find a core at once: they wait in the run queue beside
    the serving threads (processor sharing among everything runnable, share = cores /
    (busy endpoints + transfer CPU)), so each block's CPU work at its ends takes 1/share
    as long and every flow moves at 1 / (1 + transfer_cores x (1/share - 1)) of its rate
    (`compute_sharing.py` `queued_flow_speed`; checked by
    `benchmarks/sim_calibrate/wakeup_queue.py`, fix 15). False: the wake-ups never
    wait for serving threads."""
    serving_efficiency_in_transfers: float = 1.0
    """With `shared_cores`: while any block transfer is in flight on the host, every busy
    endpoint serves at this fraction of its share (its steps take more CPU each while the
    host moves blocks). Measured: the hot agent's tokens per CPU-second of its engine
    threads during a multicast over alone (`benchmarks/sim_calibrate/serving.py`,
    fix 14). 1.0 (the default): no loss."""
    send_cost_s_per_gb: float = 0.0
    """With `shared_cores`: seconds of serving one GB a node SENDS in a multicast costs
    the endpoints on that node. While a node sends at B GB/s, its endpoints (and any
    execution pipeline with a stage on it) serve at (1 - send_cost_s_per_gb * B) of their
    share (`compute_sharing.py`). 0 (the default): sending costs serving nothing (the
    paper systems, whose GPUs serve while the NIC sends). In this runtime a source's agent
    sends the blocks from the process that serves; `benchmarks/sim_calibrate/send.py`
    measures the serving rate lost per GB/s sent (`sim_calibration.json`, `send_cost`:
    0.86 on Nov 23 21:10, about the sending CPU, ~1 CPU-second per GB)."""
    endpoint_open_s: float = 0.0
    """Seconds (cores free) the controller takes to open one local instance once its node
    holds the model: the runtime's `InstanceOpenOp` and the dispatch of its first requests
    (`runtime/scaleout/local.open_local`). A multicast's openings run one after another,
    as the runtime's carrier awaits each (`surge/sim/carrier.py`); with `shared_cores` each
    stretches by the processor share. 0 (the default): the paper systems' controllers,
    whose start-up cost is `SystemConfig.init_s`; this runtime's value on this machine is
    measured by `benchmarks/sim_calibrate/main.py` (`sim_calibration.json`,
    `endpoint_open.endpoint_open_s`)."""
    pipeline_open_s: float = 0.0
    """As `endpoint_open_s`, for one execution pipeline (one `StageOpenOp` per stage, its
    head engines, its first dispatch: `PipelineEndpoint.open` + `add_endpoint`)."""

    def __post_init__(self) -> None:
        if self.shared_cores is not None and not self.shared_cores > 0:
            raise SurgeError("shared_cores must be > 0 or None")
        if self.transfer_cores < 0:
            raise SurgeError("transfer_cores must be >= 0")
        if self.transfers_first and self.shared_cores is None:
            raise SurgeError("transfers_first needs shared_cores (one host's cores)")
        if not 0 <= self.send_cpu_cores <= max(self.transfer_cores, 0.0):
            raise SurgeError("send_cpu_cores must be between 0 and transfer_cores")
        if self.serving_transfers_shared and not self.transfers_first:
            raise SurgeError("serving_transfers_shared needs transfers_first")
        if self.serving_receive_slowdown != 0 and not self.serving_receive_slowdown >= 1:
            raise SurgeError("serving_receive_slowdown must be 0 (off) or >= 1")
        if self.serving_receive_slowdown and not self.serving_transfers_shared:
            raise SurgeError("serving_receive_slowdown needs serving_transfers_shared")
        if not 0 < self.serving_efficiency_in_transfers <= 1:
            raise SurgeError("serving_efficiency_in_transfers must be in (0, 1]")
        if self.serving_efficiency_in_transfers < 1 and self.shared_cores is None:
            raise SurgeError("serving_efficiency_in_transfers needs shared_cores")
        if self.transfer_wakeups and not self.transfers_first:
            raise SurgeError("transfer_wakeups needs transfers_first")
        if self.transfer_wakeups_queue and not self.transfer_wakeups:
            raise SurgeError("transfer_wakeups_queue needs transfer_wakeups")
        if self.send_cost_s_per_gb < 0:
            raise SurgeError("send_cost_s_per_gb must be >= 0")
        if self.send_cost_s_per_gb > 0 and self.shared_cores is None:
            raise SurgeError("send_cost_s_per_gb needs shared_cores (one host's cores)")
        if self.endpoint_open_s < 0 or self.pipeline_open_s < 0:
            raise SurgeError("endpoint_open_s and pipeline_open_s must be >= 0")

    def __call__(self, world: World) -> ComputeSharing:
        """The host model of one simulation (`surge.sim.host.HostFactory`)."""
        return ComputeSharing(
            world.net,
            shared_cores=self.shared_cores,
            transfer_cores=self.transfer_cores,
            send_cost_s_per_gb=self.send_cost_s_per_gb,
            transfers_first=self.transfers_first,
            links_of_gpu=world.state.agent_links if self.serving_transfers_shared else None,
            send_cpu_cores=self.send_cpu_cores,
            receive_slowdown=self.serving_receive_slowdown,
            wakeups=self.transfer_wakeups,
            efficiency_in_transfers=self.serving_efficiency_in_transfers,
            wakeups_queue=self.transfer_wakeups_queue,
            endpoint_open_s=self.endpoint_open_s,
            pipeline_open_s=self.pipeline_open_s,
        )
