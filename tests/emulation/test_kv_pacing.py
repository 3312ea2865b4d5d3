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
from surge.policy.systems import serve_system
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


def _ingress_usage(time_dilation: float, link_gbps: float, nbytes: int) -> float:
    """An instance's `kv_ingress_usage` after one hand-off of `nbytes` to it, in a
    `PdServing` on a clock `time_dilation` times slower than the host's."""
    from surge.config import EngineConfig
    from surge.control.metrics import Metrics
    from surge.control.pd import PdControl
    from surge.policy.blitzscale.pd import PdTargets
    from surge.policy.multicast.topology import NodeLinks
    from surge.runtime.clock import Clock
    from surge.runtime.endpoints import LocalEndpoint
    from surge.runtime.server import Server
    from tests.parity.conftest import FakeClient

    class Client(FakeClient):
        async def call(self, node, op):  # the agent told its role
            return None

    real_now_s = 1000.0

    async def run() -> float:
        clock = Clock(time_dilation, monotonic=lambda: real_now_s)
        server = Server(Client(), "m", clock=clock)  # type: ignore[arg-type]
        control = PdControl(Metrics(), EngineConfig(), links={0: NodeLinks(ingress_gbps=link_gbps)})
        spec = SimpleNamespace(
            strategy="serverlessllm", system=serve_system("serverlessllm"), pd=PdTargets()
        )
        dep = SimpleNamespace(name="m", spec=spec, server=server, manifest=None, instances={})
        pd = control.attach(dep)  # type: ignore[arg-type]
        assert pd is not None
        ep = LocalEndpoint(server.client, 0, "m", "i0", capacity=4)
        await server.add_endpoint(ep)
        pd.received(None, ep, nbytes)
        [view] = pd.load(clock.now_s(), float("inf")).instances
        return view.kv_ingress_usage

    return asyncio.run(run())


def test_kv_ingress_counts_emulated_link_seconds() -> None:
    """Under emulation an agent's link caps are real, scaled D times slower: a hand-off's
    link time on them is real seconds and the P/D monitor's window is emulated seconds, so
    the incast (BlitzScale §5.2) counts it / D. Counted as real, every hand-off looked D
    times the load it is: at D = 40 each new AllCache instance in the §6.1 run joined as
    decode, the prefill instance stayed alone and AllCache served like ServerlessLLM."""
    nbytes = 100 * 10**9 // 8  # 1 s of a 100 Gb/s link
    unscaled = _ingress_usage(1.0, 100.0, nbytes)
    assert unscaled == pytest.approx(1.0 / 2.0)  # 1 link-second over the 2-s window
    assert _ingress_usage(40.0, 100.0 / 40, nbytes) == pytest.approx(unscaled)
