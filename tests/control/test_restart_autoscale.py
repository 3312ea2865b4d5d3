"""A controller restart on running agents does not reset autoscaling (docs/control.md,
Restart; `control/autoscale_memory.py`, `policy/autoscale_restart.py`): a deployment kept
`keep_alive_s` after its last request, and a FlexPipe one whose always-ready floor (30% of
its peak, §9.1) holds a group until the peak lapses, their controller dying while they idle
(nothing written at its stop: only what its loop wrote), get their instance back and go to
zero when they would have without the restart: counted from their last request, not from
the restart. Before the state file a restarted controller started them empty: at zero at
once, no floor. The kept one's instance is adopted (`policy/adoption.py`), idle since the
time the state carried. A corrupt state file is a warning: the deployments come back, with
no autoscaler state."""

import asyncio
import json
import logging
import time

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.policy.autoscale import AutoscaleState
from tests.control.strategy_run import deploy, local_cluster, wait_until

IDLE_S = 15.0
"""`keep_alive_s` of the one and `forget_peak_after_idle_s` of the other (the restart comes
~1 s into it; the instances it starts again must be up within the rest, a few seconds on a
loaded machine)."""


async def _crashed(deployments: object) -> None:
    """A controller that dies writes nothing more."""


def test_a_restart_keeps_each_deployments_idle_time_and_peak(
    tmp_path, tiny_store_dir, caplog
) -> None:
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2)
    cfg = ControllerConfig(state_dir=state, nodes=2, tick_s=0.05)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    kept = {"keep_alive_s": IDLE_S, "downscale_delay_s": IDLE_S, "max_replicas": 1}
    floor = {"downscale_delay_s": 0.3, "keep_alive_s": 0.3, "max_replicas": 1}
    floor["forget_peak_after_idle_s"] = IDLE_S
    names = ("kept", "floor")

    async def run() -> tuple[dict[str, float], float, dict[str, float]]:
        first = Controller(cfg, cluster.addresses, cluster.token)
        await first.start()
        try:
            deps = [
                await deploy(first, tiny_store_dir, "lambdascale", kept, name="kept"),
                await deploy(first, tiny_store_dir, "flexpipe", floor, name="floor"),
            ]
            reqs = [await first.submit(d, [1, 2, 3], params) for d in deps]
            await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 120)
            done_s = {d.name: r.done_t for d, r in zip(deps, reqs, strict=True)}
            await asyncio.sleep(1.0)  # idle a while
            assert all(d.instances for d in deps), "an instance held before the restart"
            # written by the controller's loop, not only at its stop: a crash keeps it too
            written = json.loads((state / "autoscale.json").read_text())["deployments"]
            assert sorted(written) == sorted(names), written
        finally:
            first._w.memory.save = _crashed  # as a crash: only what the loop wrote
            await first.stop()  # the agents keep running
        second = Controller(cfg, cluster.addresses, cluster.token)
        await second.start()
        restart_s = time.monotonic()
        try:
            deps = [second.deployments[n] for n in names]
            # The kept instance is adopted (no scale-out), idle since its last request as the
            # state file carried it, not since the restart (the FlexPipe pipeline is closed
            # and its floor starts it again).
            kept_dep = second.deployments["kept"]
            assert kept_dep.num_scale_outs == 0 and len(kept_dep.instances) == 1
            (adopted,) = kept_dep.instances.values()
            assert adopted.idle_since_s is not None
            assert abs(adopted.idle_since_s - done_s["kept"]) < 1.0, (adopted, done_s)
            await wait_until(lambda: all(d.instances for d in deps), "instances back", 30)
            zero_s: dict[str, float] = {}
            deadline = time.monotonic() + 60
            while len(zero_s) < len(deps) and time.monotonic() < deadline:
                for d in deps:
                    if not d.instances and d.name not in zero_s:
                        zero_s[d.name] = time.monotonic()
                await asyncio.sleep(0.05)
        finally:
            await second.stop()
        return done_s, restart_s, zero_s

    async def corrupt() -> list[AutoscaleState]:
        (state / "autoscale.json").write_text('{"version": 1, "deployments": {"kept": ')
        third = Controller(cfg, cluster.addresses, cluster.token)
        await third.start()
        try:
            return [third.deployments[n].autoscale_state for n in names]
        finally:
            await third.stop()

    with cluster:
        done_s, restart_s, zero_s = asyncio.run(run())
        with caplog.at_level(logging.WARNING):
            states = asyncio.run(corrupt())
    for name in names:  # at zero IDLE_S after its last request, not IDLE_S after the restart
        assert restart_s - done_s[name] >= 1.0
        assert name in zero_s, f"{name} never went to zero"
        assert done_s[name] + IDLE_S <= zero_s[name] < restart_s + IDLE_S, (done_s, zero_s)
    assert states == [AutoscaleState(), AutoscaleState()]
    assert "autoscale.json is not valid" in caplog.text
