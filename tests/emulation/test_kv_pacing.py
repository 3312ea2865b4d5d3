"""P/D hand-off K/V under GPU-time emulation is paced as the emulated model's K/V, on both
legs: the prefill agent's reply (`runtime/node/pd.AgentPd`) and the controller's adopt
(`control/emulation.kv_pace` -> `PdServing`). Paced as weight bytes, a 7B hand-off of
875 tokens took 0.61 emulated s per leg instead of 37 ms, and the emulated ServerlessLLM
§6.1 run gave one first token every ~1.4 s (docs/emulation.md)."""

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from surge.control.emulation import kv_pace
from surge.emulation import Emulation, EmulationConfig, traffic_charges
from surge.model.manifest import read_manifest
from surge.runtime.node.local_instance import Parked
from surge.runtime.node.pd import AgentPd
from surge.runtime.protocol import HandoffReply, InstanceHandoffOp, KvPart
from surge.sim.models import load_model


def test_kv_pace_is_the_emulated_kv_charge(tiny_store) -> None:
    manifest = read_manifest(tiny_store)
    emulation = Emulation.for_store(EmulationConfig.parse("blitzscale-a-hosts:llama2-7b"), manifest)
    want = traffic_charges(load_model("llama2-7b"), manifest).kv
    assert kv_pace(emulation, manifest) == pytest.approx(want)
    assert 0 < want < 1  # a real K/V byte stands for fewer emulated bytes than a weight byte
    assert kv_pace(None, manifest) == 1.0  # not emulated: as its bytes


class _Conn:
    """Records what the agent sends back."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], bytes, float]] = []

    async def send(self, header: dict[str, Any], payload: bytes = b"", pace: float = 1.0) -> None:
        self.sent.append((header, payload, pace))


def test_a_parked_kv_leaves_the_prefill_agent_at_its_models_kv_charge() -> None:
    part = KvPart(first_layer=0, end_layer=2, shape=(2, 2, 4, 1, 8))
    reply = HandoffReply(part=part, output_token_ids=(7,), num_cached=5)
    inst = SimpleNamespace(model="m", parked={"r1": Parked(reply, b"kv")})
    charges = {"m": 0.06}
    agent = AgentPd({"i": inst}, charges.__getitem__)  # type: ignore[dict-item]
    conn = _Conn()
    op = InstanceHandoffOp(instance="i", req_id="r1")
    asyncio.run(agent.op_instance_handoff(op, conn, memoryview(b"")))  # type: ignore[arg-type]
    [(_, payload, pace)] = conn.sent
    assert payload == b"kv" and pace == pytest.approx(0.06)
