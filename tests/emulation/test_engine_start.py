"""Under GPU-time emulation a new instance waits for its system's engine start (`init_s`) on
the serving clock before it serves, as the simulator charges it
(`policy.startup.serving_at_s`): after the weights (ServerlessLLM), or beside their fetch
(ParaServe §5, Eq. 5: only what the fetch did not hide). Without emulation nothing is added
(the engine's own start is real). The controller turns it on exactly when it emulates."""

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from surge.control.settings import ControllerConfig
from surge.policy.startup import engine_start_wait_s
from surge.policy.systems import system_config
from surge.runtime.clock import Clock
from surge.runtime.scaleout import local
from tests.control.scripted import D, RealTime, bare_autoscaler, emulation


def test_the_wait_is_what_the_simulator_charges() -> None:
    sllm, para = system_config("serverlessllm"), system_config("paraserve")
    assert sllm.init_s > 0 and not sllm.init_overlaps_load
    assert engine_start_wait_s(sllm, 1.0, 5.0) == pytest.approx(sllm.init_s)  # after the load
    assert para.init_s > 0 and para.init_overlaps_load
    # beside the fetch: a fetch longer than the start hides it, a shorter one does not
    assert engine_start_wait_s(para, 1.0, 1.0 + para.init_s + 2.0) == 0.0
    assert engine_start_wait_s(para, 1.0, 1.1) == pytest.approx(para.init_s - 0.1)


@pytest.mark.parametrize("paced", [True, False])
def test_load_then_serve_waits_for_the_engine_start_on_the_serving_clock(
    paced: bool, monkeypatch
) -> None:
    """ServerlessLLM's instance: weights in after 2 emulated s, then 0.5 emulated s of
    engine start (5 real s at D = 10) before its endpoint opens; none when not paced."""
    time = RealTime()
    clock = Clock(D, time, time.sleep)
    steps: list[tuple[str, float]] = []

    async def load_blocks(ctx, node, blocks, source) -> None:
        time.t += 2.0 * D
        steps.append(("loaded", clock.now_s()))

    async def open_local(ctx, node) -> None:
        steps.append(("open", clock.now_s()))

    monkeypatch.setattr(local, "load_blocks", load_blocks)
    monkeypatch.setattr(local, "open_local", open_local)
    system = system_config("serverlessllm")
    ctx = SimpleNamespace(
        server=SimpleNamespace(clock=clock),
        system=system,
        manifest=SimpleNamespace(num_blocks=4),
        paced_setups=paced,
    )
    asyncio.run(local.load_then_serve(ctx, 0, "disk"))  # type: ignore[arg-type]
    (_, loaded), (_, opened) = steps
    assert opened - loaded == pytest.approx(system.init_s if paced else 0.0)
    assert time.slept == ([pytest.approx(system.init_s * D)] if paced else [])


@pytest.mark.parametrize("emulated", [True, False])
def test_the_controller_paces_engine_starts_only_under_emulation(emulated: bool) -> None:
    config = ControllerConfig(
        state_dir=Path("/nonexistent"), emulation=emulation(D) if emulated else None
    )
    scaler = bare_autoscaler(config, started_s=0.0)
    offer = scaler.offer(SimpleNamespace(instances={}), [0], [])  # type: ignore[arg-type]
    assert offer.paced_setups is emulated
