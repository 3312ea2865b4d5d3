"""BlitzScale's load monitor in `surge serve`: a deployment's autoscaling defaults to its
system's (`SystemConfig.autoscale`), so a blitzscale deployment lets an idle instance go
after BlitzScale's 2 s (§5.3) while a lambdascale one keeps its own, longer default; a
spec's explicit fields still override; tokens/s per instance is measured by the
controller and reaches the policy."""

import asyncio
import time

import pytest

from surge.control.controller import Controller, ControllerConfig
from surge.control.spec import DeploymentSpec
from surge.engine.sampling import SamplingParams
from surge.policy.systems import system_config
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig

BLITZ = system_config("blitzscale").autoscale
LAMBDA = system_config("lambdascale").autoscale


def test_a_spec_takes_its_systems_autoscaling_and_overrides_fields() -> None:
    blitz = DeploymentSpec.from_json({"name": "b", "model": "/m", "strategy": "blitzscale"})
    assert blitz.autoscaling == BLITZ
    lam = DeploymentSpec.from_json({"name": "l", "model": "/m", "strategy": "lambdascale"})
    assert lam.autoscaling == LAMBDA
    body = {"downscale_delay_s": 5, "target_tokens_per_s": 50, "target_kv_usage": None}
    mine = DeploymentSpec.from_json(
        {"name": "m", "model": "/m", "strategy": "blitzscale", "autoscaling": body}
    )
    assert mine.autoscaling.downscale_delay_s == 5 and mine.autoscaling.target_tokens_per_s == 50
    assert mine.autoscaling.target_kv_usage is None
    assert mine.autoscaling.target_ongoing_requests == BLITZ.target_ongoing_requests


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_blitzscale_scales_down_after_two_idle_seconds_lambdascale_does_not(
    tmp_path, tiny_store_dir
) -> None:
    state = tmp_path / "state"
    (state / "registry").mkdir(parents=True)
    cfg = LocalClusterConfig(num_nodes=1, remote_dir=state / "registry")
    params = SamplingParams(max_tokens=12, ignore_eos=True)

    async def run() -> tuple[float, float, int, float]:
        with LocalCluster(cfg) as cluster:
            config = ControllerConfig(state_dir=state, nodes=1, slots_per_node=2)
            c = Controller(config, cluster.addresses, cluster.token)
            await c.start()
            try:
                blitz, lam = [
                    await c.create({"name": n, "model": str(tiny_store_dir), "strategy": n})
                    for n in ("blitzscale", "lambdascale")
                ]
                b_req, l_req = [await c.submit(d, [1, 2, 3], params) for d in (blitz, lam)]

                async def blitz_released() -> tuple[float, float]:
                    # When its request finished and when its instance went: timed on their
                    # own, whenever lambdascale's request ends (on a loaded machine it may
                    # end more than a rate window apart).
                    await asyncio.wait_for(b_req.done.wait(), 60)
                    idle_s = time.monotonic()
                    c.finished(b_req)
                    while blitz.instances:
                        assert time.monotonic() - idle_s < 10, "blitzscale kept its idle instance"
                        await asyncio.sleep(0.05)
                    return idle_s, time.monotonic() - idle_s

                async def lambda_idle() -> tuple[float, float]:
                    # When its request finished, and the tokens/s the monitor measured at
                    # its next tick (a tick samples every instance; the tiny model may finish
                    # between two).
                    await asyncio.wait_for(l_req.done.wait(), 60)
                    idle_s = time.monotonic()
                    c.finished(l_req)
                    ep = lam.serving()[0].endpoint
                    assert ep is not None and ep.num_tokens == params.max_tokens
                    monitor = c._w.autoscaler.monitor
                    rate = 0.0
                    while rate == 0.0 and time.monotonic() < idle_s + monitor.window_s / 2:
                        await asyncio.sleep(config.tick_s)
                        rate = monitor.tokens_per_s(ep, time.monotonic())
                    return idle_s, rate

                (_, gone_s), (l_idle_s, rate) = await asyncio.gather(
                    blitz_released(), lambda_idle()
                )
                # lambdascale's instance outlives BlitzScale's timeout by well over a tick.
                wait_s = l_idle_s + BLITZ.downscale_delay_s + 1.5 - time.monotonic()
                await asyncio.sleep(max(0.0, wait_s))
                return gone_s, time.monotonic() - l_idle_s, len(lam.instances), rate
            finally:
                await c.stop()

    gone_s, lam_idle_s, lam_left, rate = asyncio.run(run())
    assert rate > 0
    # Idle from when its last token came: released at BlitzScale's 2 s (give or take the
    # ticks that noticed), not at once and not at lambdascale's 10 s.
    assert BLITZ.downscale_delay_s - 0.3 <= gone_s <= BLITZ.downscale_delay_s + 2.0
    assert BLITZ.downscale_delay_s + 1.0 < lam_idle_s < LAMBDA.downscale_delay_s
    assert lam_left == 1
