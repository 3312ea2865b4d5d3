"""Under GPU-time emulation the control plane runs on the emulated clock (`runtime/clock.py`,
`control/emulation.control_clock`): with D = 10 a 1-s keep-alive lasts 10 real seconds, the
autoscaler ticks every D x `tick_s` real seconds and sees emulated time, and a request's
times (TTFT, hold timeout) are emulated seconds."""

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from surge.control.copies import Copies
from surge.control.emulation import control_clock
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.runtime.clock import REAL_CLOCK, Clock
from surge.runtime.request import ServeRequest
from tests.control.scripted import D, RealTime, ScriptedClient, bare_autoscaler, emulation


def test_the_controllers_clock_is_the_emulations() -> None:
    assert control_clock(None) is REAL_CLOCK
    clock = control_clock(emulation())
    assert clock.time_dilation == D
    real = RealTime()
    clock = Clock(D, real, real.sleep)
    start = clock.now_s()
    asyncio.run(clock.sleep(1.0))  # one emulated second
    assert real.slept == [10.0]
    assert clock.now_s() - start == pytest.approx(1.0)
    assert clock.real_s(0.1) == pytest.approx(1.0)
    assert clock.of_real(5.0) == pytest.approx(0.5)


def test_a_one_second_keep_alive_lasts_d_real_seconds() -> None:
    real = RealTime()
    clock = Clock(D, real, real.sleep)
    client, pool = ScriptedClient(), ParameterPool()
    pool.add_model("m", 4)
    manifest = SimpleNamespace(total_bytes=1 << 20, num_blocks=4)
    dep = SimpleNamespace(
        name="m", manifest=manifest, host_last_used_s={}, pinned_nodes=set(), instances={}
    )
    dep.spawn = lambda coro: asyncio.get_event_loop().create_task(coro)
    config = ControllerConfig(state_dir=Path("/nonexistent"), host_keep_alive_s=1.0)
    copies = Copies(client, pool, {"m": dep}, config, lambda: [0], clock.now_s(), clock)  # type: ignore[arg-type]

    async def run() -> list[bool]:
        await copies.make_host_copy(dep, 0, pin=False)  # type: ignore[arg-type]
        held = []
        for real_s in (5.0, 4.5, 1.0):  # 5, 9.5, 10.5 real seconds after its last use
            real.t += real_s
            copies.expire(clock.now_s())
            held.append(pool.complete("m", "host") == [0])
            await asyncio.sleep(0)
        return held

    assert asyncio.run(run()) == [True, True, False]


def test_the_autoscaler_ticks_on_the_emulated_clock() -> None:
    """tick_s 0.05 at D = 10: a tick every 0.5 real s, each seeing 0.05 emulated s pass
    (the host's clock would tick ~10x as often, each seeing 0.05 real s)."""
    config = ControllerConfig(state_dir=Path("/nonexistent"), tick_s=0.05)
    clock = control_clock(emulation())
    scaler = bare_autoscaler(config, clock=clock)
    ticks: list[tuple[float, float]] = []

    async def record(now_s: float, dt_s: float) -> None:
        ticks.append((now_s, dt_s))

    scaler.tick = record  # type: ignore[method-assign]

    async def run() -> float:
        task = asyncio.get_running_loop().create_task(scaler.run())
        t0 = asyncio.get_running_loop().time()
        await asyncio.sleep(1.6)
        task.cancel()
        return asyncio.get_running_loop().time() - t0

    real_s = asyncio.run(run())
    assert 1 <= len(ticks) <= 4, ticks  # 0.5 real s apart (the host's clock: ~30)
    for _, dt_s in ticks:
        assert dt_s == pytest.approx(0.05, abs=0.03)  # emulated seconds between ticks
    assert ticks[-1][0] - ticks[0][0] <= real_s / D


def test_a_requests_times_are_emulated_seconds() -> None:
    real = RealTime()
    clock = Clock(D, real, real.sleep)
    req = ServeRequest("r0", [1, 2], SamplingParams(max_tokens=2), clock=clock)
    real.t += 5.0
    req.add_token(7, False, None)
    real.t += 1.0
    req.add_token(8, True, "length")
    assert req.first_token_t - req.arrival_t == pytest.approx(0.5)  # TTFT, emulated s
    assert req.token_times[1] - req.token_times[0] == pytest.approx(0.1)  # TBT
    assert req.done_t - req.arrival_t == pytest.approx(0.6)


def test_live_scaling_lets_a_dilated_step_finish(monkeypatch) -> None:
    """BlitzScale's live scaling lets the step in progress finish `STOP_WAIT_S` of the
    serving clock: at D = 10 a step of 10x its emulated time is not cut off (cut off, its
    live prefill is lost and its requests are prefilled again)."""
    from surge.runtime.scaleout import live

    monkeypatch.setattr(live, "STOP_WAIT_S", 0.03)  # 0.3 real s at D = 10
    ctx = SimpleNamespace(server=SimpleNamespace(clock=Clock(D)))
    scaling = live.LiveScaling(ctx, {})  # type: ignore[arg-type]

    async def run() -> bool:
        step = asyncio.get_running_loop().create_task(asyncio.sleep(0.15))  # a dilated step
        await scaling.stop(step)
        return step.cancelled()

    assert asyncio.run(run()) is False
