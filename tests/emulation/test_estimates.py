"""Under GPU-time emulation the control plane's estimates of compute and fetch times are the
emulated cluster's (`control/emulation.serving_estimates`), in emulated seconds for the real
store, and an emulated agent's stage profile reports the emulated GPU's layer times."""

import asyncio
from types import SimpleNamespace

import pytest

from surge.control.emulation import serving_estimates
from surge.emulation import Emulation, EmulationConfig, StepPacer
from surge.policy.systems import system_config
from surge.runtime.node.refactor import refactor_handlers
from surge.runtime.protocol import StageProfileOp
from surge.runtime.scaleout.estimates import HOST_ESTIMATES
from surge.runtime.scaleout.flexpipe import layer_profile, load_seconds
from surge.sim.costs import cost_model
from surge.sim.hardware import gpu_profile
from surge.sim.models import load_model

REAL_BYTES = 8_000_000


def test_estimates_are_the_emulated_gpus_and_links() -> None:
    assert serving_estimates(None) is HOST_ESTIMATES
    e = Emulation(EmulationConfig.parse("paraserve-1:llama2-7b", 40.0), REAL_BYTES)
    est = serving_estimates(e)
    model = load_model("llama2-7b")
    cost = cost_model(model, gpu_profile("A10"))  # paraserve-1's first GPUs
    # A decode step of the real store lasts what the emulated GPU's does (emulated s).
    assert est.decode_s(REAL_BYTES) == pytest.approx(cost.decode_s(1))
    assert est.prefill_over_decode == pytest.approx(cost.prefill_s(32) / cost.decode_s(1))
    # The real store over the fetch rate takes what the emulated model takes over the
    # emulated registry link (16 Gb/s NIC), not D times that: the clock is emulated.
    manifest = SimpleNamespace(total_bytes=REAL_BYTES, arch=SimpleNamespace(num_layers=16))
    emulated_s = model.total_bytes * 8 / 16e9
    rates = est.tier_rates()
    assert load_seconds(manifest, ["remote"], rates) == pytest.approx(emulated_s)  # type: ignore[arg-type]
    # From a host copy: over the emulated PCIe (128 Gb/s on paraserve-1).
    pcie_s = model.total_bytes * 8 / 128e9
    assert load_seconds(manifest, ["remote", "host"], rates) == pytest.approx(pcie_s)  # type: ignore[arg-type]
    # FlexPipe's layer profile before measuring: the emulated decode step over the layers.
    manifest.arch.hidden_size = 128
    profile = layer_profile(manifest, system_config("flexpipe"), None, est)  # type: ignore[arg-type]
    assert profile.decode_s * 16 == pytest.approx(cost.decode_s(1))


def test_an_emulated_stage_profiles_the_emulated_gpus_layer_times() -> None:
    pacer = StepPacer(load_model("llama2-13b"), "H800", 80.0)
    runner = SimpleNamespace(
        arch=SimpleNamespace(num_layers=16, hidden_size=128), dtype=SimpleNamespace(itemsize=4)
    )
    stage = SimpleNamespace(runner=runner, first_layer=4, end_layer=8, lock=asyncio.Lock())
    handlers = refactor_handlers(lambda name: stage, 0, None, pacer)  # type: ignore[arg-type]
    op = StageProfileOp(pipeline="p", num_tokens=32)
    reply = asyncio.run(handlers[StageProfileOp](op, None, memoryview(b"")))  # type: ignore[arg-type]
    one = pacer.emulated_s((1,), 0, 1, 16)  # one real layer of 16 stands for 40/16 emulated ones
    assert reply.decode_s == pytest.approx((one,) * 4)
    assert reply.prefill_s == pytest.approx((pacer.emulated_s((32,), 0, 1, 16),) * 4)
    assert reply.first_layer == 4
