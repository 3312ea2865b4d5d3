"""P/D disaggregation on real agents (BlitzScale §5.2, §6): every request is prefilled on a
prefill instance, its K/V handed to a decode instance over the transport, and decoded
there token-exact; mutation turns a prefill instance into a decode one in place; an agent
killed during a hand-off loses no request."""

import asyncio

import pytest

from surge.config import EngineConfig
from surge.engine.sampling import SamplingParams
from surge.policy.blitzscale.pd import DECODE, PREFILL, PdTargets
from surge.runtime.endpoints import LocalEndpoint
from surge.runtime.migration.pd_handoff import PdServing
from surge.runtime.server import Server
from tests.runtime.conftest import MODEL
from tests.runtime.test_serving import PROMPTS, check_against_reference, ready_cluster

MAX_KV = EngineConfig().max_kv_tokens


async def _pd_server(cluster, manifest, targets: PdTargets, nodes: list[int], cls=PdServing):
    client = await ready_cluster(cluster, manifest)
    server = Server(client, MODEL)
    server.pd = cls(server, targets, MAX_KV)
    eps = []
    for n in nodes:
        ep = LocalEndpoint(client, n, MODEL, f"{MODEL}-node{n}")
        await ep.open()
        await server.add_endpoint(ep)
        eps.append(ep)
    return client, server, eps


def test_prefill_hands_kv_to_the_least_loaded_decode_instance(
    make_cluster, manifest, tiny_hf
) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    async def run():
        client, server, _ = await _pd_server(cluster, manifest, PdTargets(1, 2), [0, 1, 2])
        try:
            reqs = [server.new_request(p, params) for p in PROMPTS * 2]
            for r in reqs:
                await server.submit(r)
            await server.wait_all(60)
            return reqs, dict(server.pd.roles), server.pd.num_handoffs
        finally:
            await server.close()
            await client.close()

    reqs, roles, handoffs = asyncio.run(run())
    assert roles == {f"{MODEL}-node0": PREFILL, f"{MODEL}-node1": DECODE, f"{MODEL}-node2": DECODE}
    # Router: every request starts on the prefill instance; hand-off: each ends on a decode
    # instance, and the least-loaded rule spreads them over both.
    assert all(r.hops[0] == f"{MODEL}-node0" and len(r.hops) == 2 for r in reqs), [
        r.hops for r in reqs
    ]
    assert {r.hops[1] for r in reqs} == {f"{MODEL}-node1", f"{MODEL}-node2"}
    assert handoffs == len(reqs)
    check_against_reference(tiny_hf, reqs, 24)


def test_mutation_turns_a_prefill_instance_into_decode_without_reloading(
    make_cluster, manifest, tiny_hf
) -> None:
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    async def run():
        client, server, eps = await _pd_server(cluster, manifest, PdTargets(2, 1), [0, 1, 2])
        try:
            before = [server.new_request(p, params) for p in PROMPTS * 2]
            for r in before:
                await server.submit(r)
            await server.wait_all(60)
            await server.pd.mutate(eps[1])  # node 1: prefill -> decode, same engine
            after = [server.new_request(p, params) for p in PROMPTS * 3]
            for r in after:
                await server.submit(r)
            await server.wait_all(60)
            return before, after, dict(server.pd.roles)
        finally:
            await server.close()
            await client.close()

    before, after, roles = asyncio.run(run())
    assert roles[f"{MODEL}-node1"] == DECODE
    assert {r.hops[0] for r in before} == {f"{MODEL}-node0", f"{MODEL}-node1"}
    assert all(r.hops[1] == f"{MODEL}-node2" for r in before)
    # After the mutation node 1 takes no new request and decodes hand-offs.
    assert all(r.hops[0] == f"{MODEL}-node0" for r in after)
    assert f"{MODEL}-node1" in {r.hops[1] for r in after}
    check_against_reference(tiny_hf, before + after, 24)


@pytest.mark.parametrize("victim", ["prefill", "decode"])
def test_an_agent_killed_during_a_handoff_loses_no_request(
    victim, make_cluster, manifest, tiny_hf
) -> None:
    """The first hand-off kills an agent before it moves the K/V: the prefill instance
    (its parked K/V is gone: the request is prefilled again elsewhere) or the decode
    instance it would go to (another adopts it). Every request ends token-exact."""
    cluster = make_cluster(3, preload_engine=True)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    node = 0 if victim == "prefill" else 1

    class Killing(PdServing):
        killed = False

        async def handoff(self, src, req, target):
            if not Killing.killed:
                Killing.killed = True
                await asyncio.to_thread(cluster.kill, node)
            await super().handoff(src, req, target)

    async def run():
        client, server, _ = await _pd_server(cluster, manifest, PdTargets(1, 2), [0, 1, 2], Killing)
        try:
            reqs = [server.new_request(p, params) for p in PROMPTS * 2]
            for r in reqs:
                await server.submit(r)
            await server.wait_all(60)
            return reqs, server.pd.num_handoffs
        finally:
            await server.close()
            await client.close()

    reqs, handoffs = asyncio.run(run())
    assert Killing.killed
    if victim == "decode":  # the others still hand off (to the decode instance left, or
        # decode in place when the adoption the kill broke falls back to the source)
        assert handoffs >= 1
    assert all(f"{MODEL}-node{node}" != r.hops[-1] for r in reqs), [r.hops for r in reqs]
    check_against_reference(tiny_hf, reqs, 30)
