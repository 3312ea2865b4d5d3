"""The machines a simulated cluster's endpoints compute on: a seam for a host model.

In: endpoints made (`attach`), multicast block transfers starting and ending
(`on_transfers`, with the sender's lead GPU and egress link), and the loading actions a
multicast's carrier is about to carry out (`action_s`). Out: what those cost in time, by
setting an endpoint's `share` of its compute, the flow network's speeds, and the seconds an
action takes. Owned by the simulator (`Simulation(host=...)`); no decision is made here.

Every paper profile is a real GPU cluster: each GPU computes on its own and a controller
action costs nothing beyond the system's `SystemConfig.init_s`: `DedicatedHost`, the
default. Under GPU-time emulation a node's time is the emulated GPU's too
(docs/emulation.md), so `surge simulate` needs nothing else. A model of one machine's
shared CPU cores (the testbed surge was first calibrated on: agents on 2 shared cores,
block transfers taking CPU from serving) lives beside the benchmarks that measure it,
`benchmarks/sim_calibrate/testbed.py`, and plugs in here.
"""

from collections.abc import Callable
from typing import Protocol

from surge.sim.flows import Link
from surge.sim.instance import Instance
from surge.sim.world import World


class HostModel(Protocol):
    """What the simulator tells the host model and asks of it."""

    def attach(self, inst: Instance) -> None:
        """`inst` was made: watch it (e.g. set `inst.on_busy`)."""

    def on_transfers(self, delta: int, sender_gpu: int | None, egress: Link | None) -> None:
        """`delta` block transfers started (+) or ended (-); `sender_gpu` (None: a host
        copy, which serves nothing) sends them out of `egress`."""

    def action_s(self, action: object) -> float:
        """Seconds from now that carrying out `action` (a `surge.policy.loading` action
        on a multicast's carrier, `sim/carrier.py`) takes; 0: at once."""


class DedicatedHost:
    """A real GPU cluster: every endpoint computes on its own GPUs, actions are free."""

    def attach(self, inst: Instance) -> None:
        """Nothing to watch."""

    def on_transfers(self, delta: int, sender_gpu: int | None, egress: Link | None) -> None:
        """Transfers take nothing from serving (the NIC and copy engines move them)."""

    def action_s(self, action: object) -> float:
        """Free: opening an endpoint costs the system's `init_s` elsewhere."""
        return 0.0


HostFactory = Callable[[World], HostModel]
"""Builds a run's host model from its world (net, cluster state, settings)."""
