"""Block transfers ahead of serving (`TestbedHost.transfers_first`,
`compute_sharing.py`): flows take their CPU first, busy endpoints share what is left;
off, every consumer gets one equal share (the old model)."""

import numpy as np
import pytest

from benchmarks.sim_calibrate.compute_sharing import ComputeSharing
from benchmarks.sim_calibrate.testbed import TestbedHost
from surge.errors import SurgeError
from surge.sim.simulator import simulate
from surge.traces.request import Trace
from tests.sim_calibrate.testbed_burst import burst_on_testbed


class _Net:
    """Records the flow speed the sharing sets."""

    def __init__(self) -> None:
        self.speed = 1.0

    def set_speed(self, speed: float) -> None:
        self.speed = speed


@pytest.mark.parametrize("first", [False, True])
def test_flow_speed_and_endpoint_share(first: bool) -> None:
    net = _Net()
    sharing = ComputeSharing(net, 1.0, 0.5, transfers_first=first)  # type: ignore[arg-type]
    sharing.on_transfers(+1)
    # demand 0.5 of 1 core: the flow is not slowed either way; transfers first leave an
    # endpoint the other half core, equal shares give it all it needs (0.5 + 1 > 1 is only
    # counted once an endpoint is busy)
    assert net.speed == 1.0
    assert sharing.share() == (0.5 if first else 1.0)
    sharing.on_transfers(+2)  # 1.5 cores of transfers on 1 core
    assert net.speed == pytest.approx(1 / 1.5)
    assert sharing.share() == pytest.approx(0.01 if first else 1 / 1.5)


def test_a_serving_endpoint_gets_what_transfers_leave(tmp_path):
    """2 nodes, a slow link: one block transfer (0.5 core) is in flight for all of the warm
    instance's first prefill (0.1 s of work) on a 1-core host. Equal shares: demand 1.5,
    each gets 2/3; transfers first: the flow runs at full speed, the endpoint on 0.5."""
    trace = Trace("t", np.zeros(4), np.full(4, 4), np.full(4, 1))
    first_ttft = {}
    for first in (False, True):
        settings, system, host = burst_on_testbed(
            tmp_path, 2, 1e-3, "none", shared_cores=1.0, transfer_cores=0.5,
            transfers_first=first,
        )  # fmt: skip
        res = simulate(trace, settings, system=system, host=host)
        first_ttft[first] = float(np.min(res.first_token_s - res.arrival_s))
    assert first_ttft[False] == pytest.approx(0.001 + 0.099 / (1 / 1.5), abs=1e-6)
    assert first_ttft[True] == pytest.approx(0.001 + 0.099 / 0.5, abs=1e-6)


def test_needs_shared_cores() -> None:
    with pytest.raises(SurgeError, match="transfers_first needs shared_cores"):
        TestbedHost(transfers_first=True)
