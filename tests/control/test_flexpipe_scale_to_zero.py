"""A FlexPipe deployment in `surge serve` goes back to zero once it has idled
`forget_peak_after_idle_s`: its always-ready floor (§9.1: 30% of the pool's historical
peak, ceil(0.3 x 1) = 1 group after one request) keeps a group past the reclamation delay
only until the peak is forgotten (`policy.autoscale.decide`, carried out by the
controller's tick). The same deployment with the peak kept for good (null) holds its group:
what every FlexPipe deployment did before the setting (it never scaled to zero again)."""

import asyncio
import time

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from tests.control.strategy_run import deploy, local_cluster, wait_until

FORGET_S = 2.0
"""The test's idle stretch before the peak lapses (default 900 s): well past the 0.3-s
reclamation delay, so only the lapse can release the floor's group."""


def test_an_idle_flexpipe_deployment_forgets_its_peak_and_scales_to_zero(
    tmp_path, tiny_store_dir
) -> None:
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    quick = {"downscale_delay_s": 0.3, "keep_alive_s": 0.3, "max_replicas": 1}

    async def run() -> tuple[float, float, int, int]:
        ctl = Controller(
            ControllerConfig(state_dir=state, nodes=2, tick_s=0.05), cluster.addresses,
            cluster.token,
        )  # fmt: skip
        await ctl.start()
        try:
            lapses = await deploy(
                ctl, tiny_store_dir, "flexpipe", quick | {"forget_peak_after_idle_s": FORGET_S}
            )
            keeps = await deploy(
                ctl, tiny_store_dir, "flexpipe", quick | {"forget_peak_after_idle_s": None},
                name="keeps",
            )  # fmt: skip
            assert lapses.spec.autoscaling.always_ready_fraction == 0.3  # the system's
            reqs = [await ctl.submit(d, [1, 2, 3], params) for d in (lapses, keeps)]
            await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 120)
            done_s = max(r.done_t for r in reqs)
            peaks = (lapses.autoscale_state.peak_instances, keeps.autoscale_state.peak_instances)
            assert peaks == (1, 1), peaks
            await wait_until(lambda: not lapses.instances, "the idle deployment at zero", 60)
            zero_s = time.monotonic()
            await asyncio.sleep(0.5)  # a few more ticks: the other one keeps its group
            return done_s, zero_s, len(keeps.instances), keeps.autoscale_state.peak_instances
        finally:
            await ctl.stop()

    with cluster:
        done_s, zero_s, kept, kept_peak = asyncio.run(run())
    assert zero_s - done_s >= FORGET_S, (done_s, zero_s)  # held by the floor until the lapse
    assert (kept, kept_peak) == (1, 1)
