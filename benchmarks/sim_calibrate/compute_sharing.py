"""Processor sharing of one host's cores: the CPU testbed's host model (`testbed.TestbedHost`).

Not the product simulator's: under GPU-time emulation, and on every paper profile, a node's
time is its GPU's (`surge/sim/host.py`); this models the testbed surge was first calibrated
on (every agent on one machine's 2 cores), for `benchmarks/sim_calibrate`. It plugs into
the simulator as its `HostModel` (`Simulation(host=TestbedHost(...))`).

In: endpoints turning busy or idle (`Instance.on_busy`) and multicast block transfers
starting and ending (with their sender's lead GPU and egress link). Out: every busy
endpoint's `share` and the flow network's speed: each consumer gets min(1, cores /
demand) of what it needs, demand = busy endpoints (a pipeline counts once: a 3-stage
pipeline with 2 micro-batch streams measured ~1.0 core, like a local instance) +
`transfer_cores` per block transfer in flight (transfers slow down too:
`FlowNetwork.set_speed`). With `shared_cores` None nothing is shared. With
`transfers_first` the transfers take their CPU first (flows at min(1, cores / transfer
demand)) and busy endpoints share what is left (I/O-bound agents run ahead of CPU-bound
serving under Linux's scheduler; `TestbedHost.transfers_first`).

Sending and serving on one node (`TestbedHost.send_cost_s_per_gb`): a node's agent sends
the blocks of a multicast from the process that serves, so while a node sends at B GB/s
its endpoints serve at
(1 - send_cost_s_per_gb * B) of their share (at least `MIN_SERVING_FRACTION`); an
execution pipeline runs at the pace of its slowest stage, so it takes the largest sending
load among its GPUs. B is the sender's egress links' capacity times the flow network's
speed while it has a transfer in flight (its egress is what a multicast sender fills).
0 (the default): the old model exactly.

Serving agents move blocks at their share (`TestbedHost.serving_transfers_shared`, with
`transfers_first`): transfers go first because the agents that only move blocks are
I/O-bound. An agent that also serves (a busy endpoint on its GPU: a hot source, a pipeline
stage) is CPU-bound, and a block's CPU work at its end (framing and sending out of the
sender, receive and crc32 verify in the receiver) runs in that process at the share s the
scheduler gives it. A block's time at that end is its wire time plus that CPU's extra
wait: with e the cores the end's CPU work takes at the link's full rate, the end's link
moves at 1 / (1 + e * (1/s - 1)) of its rate (`Link.speed`). e is measured: the sender's
`send_cpu_cores` and the receiver's `transfer_cores - send_cpu_cores`. With
`TestbedHost.serving_receive_slowdown` r (measured: blocks into a serving agent vs into an
idle one, at once), a serving node's ingress links move at 1/r instead (calibration fix 11).

Transfers as wake-ups (`TestbedHost.transfer_wakeups`, with `transfers_first`): the
transfers' CPU is not a fluid that fills the cores the endpoints leave idle; it comes as
short wake-ups of the agents that move blocks (one per chunk received, verified, relayed),
each taking a whole core while it runs, ahead of serving. With a transfer demand of a cores
on c cores, the number of cores those wake-ups hold at an instant is modelled as an M/M/c
queue's busy servers (Erlang: `cores_held`), and the B busy endpoints (one thread each) run
on the cores left: share = E[min(B, c - n)] / B. With B >= c that is (c - a) / B, the fluid
share; with fewer endpoints than cores it is less (a hot source alone on 2 cores gets 0.83
of a core, not 1, at a = 0.68: the wake-ups land on its core whenever the other one is
taken). Measured: `benchmarks/sim_calibrate/serving.py` (calibration fix 12).

Wake-ups queue behind serving (`TestbedHost.transfer_wakeups_queue`, with `transfer_wakeups`;
calibration fix 15): the wake-ups go first only while a core is free for them. When the B
busy endpoints (one serving thread's core each; a pipeline counts once, as its stages take
turns) and the transfers' CPU a want more than the c cores, every core is held by a serving
thread and a waking transfer waits in the run queue with them: processor sharing among
everything runnable, s = c / (B + a). A block's CPU work at its ends (w = `transfer_cores`
at the link's full rate) then takes 1/s as long, and every flow moves at
1 / (1 + w * (1/s - 1)) of its rate (fix 9's end formula, host-wide: the 2 cores are shared
by every agent). K=2 execute-while-load: 2 hot sources + 3 pipelines on the receivers, ~14
transfers x 0.10 cores: s ~ 0.31, flows at ~0.82 (the runtime's multicast ran ~1.17x the
simulated one); K=1 stop-the-world (1 endpoint + ~0.7 cores of wake-ups): no change.
Measured: `benchmarks/sim_calibrate/wakeup_queue.py` (the receivers' event loops' run-queue wait
and the multicast's time with and without pipelines serving on them).

Serving per core while transfers run (`TestbedHost.serving_efficiency_in_transfers` e,
default 1): while any block transfer is in flight on the host, every busy endpoint serves
at e of its share (a serving agent's steps take more CPU each while the host moves blocks:
measured as the hot agent's tokens per second of its engine threads' CPU with a multicast
over alone, calibration fix 14).
"""

import math
from collections import Counter
from collections.abc import Callable

from surge.policy.loading import GoLocal, OpenPipeline
from surge.sim.flows import FlowNetwork, Link
from surge.sim.instance import Instance

BYTES_PER_GB = 1e9
MIN_SHARE = 0.01
"""Floor of an endpoint's share when transfers take the cores first (every step ends)."""
MIN_SERVING_FRACTION = 0.01
"""Floor of what sending leaves to serving, so every step still ends (a loss of all of it
is outside what was measured)."""


def cores_held(demand: float, cores: int) -> list[float]:
    """P(n) for n = 0..cores-1: the probability that the wake-ups of a CPU demand of `demand`
    cores (Poisson arrivals, exponential service, `cores` servers: M/M/c) hold exactly n
    cores; the rest of the mass is every core held. Saturated (demand >= cores): all 0."""
    if demand >= cores:
        return [0.0] * cores
    terms = [demand**n / math.factorial(n) for n in range(cores)]
    tail = demand**cores / (math.factorial(cores) * (1.0 - demand / cores))
    p0 = 1.0 / (sum(terms) + tail)
    return [p0 * t for t in terms]


def queued_flow_speed(cores: float, busy: int, demand: float, transfer_cores: float) -> float:
    """The speed of block flows whose wake-ups queue behind `busy` serving threads (module
    docstring, calibration fix 15): 1 / (1 + transfer_cores * (1/s - 1)), s = min(1, cores /
    (busy + demand)) the share of a runnable thread; 1.0 while busy + demand <= cores."""
    runnable = busy + demand
    if runnable <= cores:
        return 1.0
    return 1.0 / (1.0 + transfer_cores * (runnable / cores - 1.0))


def wakeup_share(cores: float, busy: int, demand: float) -> float:
    """The share of one core each of `busy` single-threaded endpoints gets while wake-ups
    of `demand` cores run first on `cores` cores (rounded to whole cores, at least 1):
    E[min(busy, c - n)] / busy over `cores_held` (module docstring)."""
    c = max(1, round(cores))
    busy = max(busy, 1)
    left = sum(p * min(busy, c - n) for n, p in enumerate(cores_held(demand, c)))
    return min(1.0, left / busy)


class ComputeSharing:
    """The busy endpoints and transfers of the shared host."""

    def __init__(
        self,
        net: FlowNetwork,
        shared_cores: float | None,
        transfer_cores: float,
        send_cost_s_per_gb: float = 0.0,
        transfers_first: bool = False,
        links_of_gpu: Callable[[int], tuple[tuple[Link, ...], tuple[Link, ...]]] | None = None,
        send_cpu_cores: float = 0.0,
        receive_slowdown: float = 0.0,
        wakeups: bool = False,
        efficiency_in_transfers: float = 1.0,
        wakeups_queue: bool = False,
        endpoint_open_s: float = 0.0,
        pipeline_open_s: float = 0.0,
    ) -> None:
        self.net = net
        self.open_s = {GoLocal: endpoint_open_s, OpenPipeline: pipeline_open_s}
        """Controller seconds (cores free) to open a local instance / a pipeline."""
        self.shared_cores = shared_cores
        self.transfer_cores = transfer_cores
        self.transfers_first = transfers_first
        self.links_of_gpu = links_of_gpu if transfers_first else None
        """GPU -> its agent's (egress, ingress) links (`serving_transfers_shared`)."""
        self.send_cpu_cores = min(send_cpu_cores, transfer_cores)
        """Of `transfer_cores`, the sender's part (the rest is the receiver's)."""
        self.receive_slowdown = receive_slowdown
        """Measured slow-down of blocks into a serving agent (0: the share formula)."""
        self.send_cost_s_per_gb = send_cost_s_per_gb if shared_cores is not None else 0.0
        self.wakeups = wakeups and transfers_first
        """Transfers' CPU as wake-ups holding whole cores (`wakeup_share`), not a fluid."""
        self.wakeups_queue = wakeups_queue and self.wakeups
        """Wake-ups wait in the run queue when serving fills the cores (`queued_flow_speed`)."""
        self.efficiency_in_transfers = efficiency_in_transfers if shared_cores else 1.0
        """What a busy endpoint keeps of its share while transfers are in flight."""
        self.busy: dict[int, Instance] = {}
        """Busy endpoints by id."""
        self.transfers = 0
        """Multicast block transfers in flight."""
        self._shared_links: set[Link] = set()
        """Links slowed to a serving agent's share last time."""
        self.sending: dict[int, Counter[Link]] = {}
        """Sender lead GPU -> its transfers in flight per egress link (with a send cost)."""

    @property
    def enabled(self) -> bool:
        """Whether endpoints share cores at all."""
        return self.shared_cores is not None

    def share(self) -> float:
        """The share a CPU-bound consumer (a busy endpoint, an endpoint opening,
        `sim/carrier.py`) gets now: min(1, cores / demand), demand = busy endpoints +
        transfer CPU; with `transfers_first`, min(1, cores left after the transfers / busy
        endpoints). 1.0 when nothing is shared."""
        if self.shared_cores is None:
            return 1.0
        transfer_demand = self.transfer_cores * self.transfers
        if self.transfers_first:
            held = transfer_demand * self.flow_speed()
            if self.wakeups:
                return max(wakeup_share(self.shared_cores, len(self.busy), held), MIN_SHARE)
            left = max(self.shared_cores - held, 0.0)
            return max(min(1.0, left / max(len(self.busy), 1)), MIN_SHARE)
        demand = len(self.busy) + transfer_demand
        return min(1.0, self.shared_cores / demand) if demand > 0 else 1.0

    def flow_speed(self) -> float:
        """The speed of block flows: the endpoints' share, or with `transfers_first`
        min(1, cores / transfer CPU demand)."""
        if self.shared_cores is None:
            return 1.0
        if not self.transfers_first:
            return self.share()
        demand = self.transfer_cores * self.transfers
        if demand <= 0:
            return 1.0
        speed = min(1.0, self.shared_cores / demand)
        if self.wakeups_queue:
            speed *= queued_flow_speed(
                self.shared_cores, len(self.busy), demand * speed, self.transfer_cores
            )
        return speed

    def attach(self, inst: Instance) -> None:
        """`inst` was made (`HostModel.attach`): its busy / idle turns reshare the cores."""
        if self.enabled:
            inst.on_busy = self.on_busy

    def action_s(self, action: object) -> float:
        """Seconds to carry out `action` now (`HostModel.action_s`): opening a local
        instance or an execution pipeline costs its measured controller seconds with the
        cores free, stretched by the processor share at its start (the runtime's carrier
        awaits each opening: `runtime/scaleout/multicast.LoadingCarrier`); the rest, none."""
        cost_s = self.open_s.get(type(action), 0.0)
        return cost_s / self.share() if cost_s > 0 else 0.0

    def on_busy(self, inst: Instance) -> None:
        """`inst` turned busy or idle."""
        if inst.busy:
            self.busy[inst.id] = inst
        else:
            self.busy.pop(inst.id, None)
        self._reshare()

    def on_transfers(
        self, delta: int, sender_gpu: int | None = None, egress: Link | None = None
    ) -> None:
        """`delta` block transfers started (+) or ended (-); `sender_gpu` (None: a host
        copy, which serves nothing) sends them out of `egress`."""
        self.transfers += delta
        tracked = False
        if self.send_cost_s_per_gb > 0 and sender_gpu is not None and egress is not None:
            links = self.sending.setdefault(sender_gpu, Counter())
            links[egress] += delta
            if links[egress] <= 0:
                del links[egress]
            if not links:
                del self.sending[sender_gpu]
            tracked = True
        if self.shared_cores is not None and (self.transfer_cores > 0 or tracked):
            self._reshare()

    def serving_fraction(self, inst: Instance) -> float:
        """What sending leaves of `inst`'s share: 1 - the largest sending loss among its
        GPUs."""
        load = 0.0
        for gpu in inst.placement.all_gpus:
            links = self.sending.get(gpu)
            if links:
                gb_per_s = sum(link.bytes_per_s for link in links) * self.net.speed / BYTES_PER_GB
                load = max(load, self.send_cost_s_per_gb * gb_per_s)
        return max(1.0 - load, MIN_SERVING_FRACTION)

    def _reshare(self) -> None:
        share = self.share()
        if self.transfer_cores > 0:
            self.net.set_speed(self.flow_speed())
        for iid in sorted(self.busy):
            inst = self.busy[iid]
            mine = share * self.serving_fraction(inst) if self.sending else share
            if self.transfers > 0:
                mine *= self.efficiency_in_transfers
            if inst.share != mine:
                inst.set_share(mine)
        if self.links_of_gpu is not None and self.shared_cores is not None:
            self._share_serving_links()

    def _share_serving_links(self) -> None:
        """Links at a node with a busy endpoint move blocks at what its CPU share allows."""
        ends = (self.send_cpu_cores, self.transfer_cores - self.send_cpu_cores)
        speeds: dict[Link, float] = {}
        for iid in sorted(self.busy):
            inst = self.busy[iid]
            wait = 1.0 / max(inst.share, MIN_SHARE) - 1.0
            factors = [1.0 / (1.0 + cores * wait) for cores in ends]
            if self.receive_slowdown >= 1.0:
                factors[1] = 1.0 / self.receive_slowdown
            for gpu in inst.placement.all_gpus:
                for links, factor in zip(self.links_of_gpu(gpu), factors, strict=True):  # type: ignore[misc]
                    for link in links:
                        speeds[link] = min(speeds.get(link, 1.0), factor)
        for link in self._shared_links - speeds.keys():
            speeds[link] = 1.0
        self._shared_links = set(speeds)
        self.net.set_link_speeds(speeds)
