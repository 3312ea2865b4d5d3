"""BlitzScale chain tails in `surge serve` (§5.1 Alg. 1 line 10): a second scale-out that
starts while the first one's receiver is still loading takes that receiver as its source
(tier `loading`) instead of the serving instance whose egress the first one holds; the tail
forwards each block as it lands, and the new instance serves token-exact."""

import asyncio

from surge.config import EngineConfig
from surge.engine.sampling import SamplingParams
from surge.policy.startup import Copy, Destination, Source
from surge.policy.systems import system_config
from surge.runtime.protocol import BlockArrived
from surge.runtime.scaleout import ControllerHooks, ScaleOutContext, run_scale_out
from surge.runtime.scaleout.run import startup_plan
from tests.engine.reference import assert_same_tokens, hf_greedy
from tests.runtime.conftest import MODEL
from tests.runtime.test_consolidation import connected_server

MAX_TOKENS = 12
PROMPT = [0, 5, 9, 200, 31]


def test_a_scale_out_forwards_from_a_receiver_still_loading(
    make_cluster, manifest, tiny_hf
) -> None:
    cluster = make_cluster(3, link_gbps=0.02, preload_engine=True)
    receiving: dict[int, bool] = {}
    sending: dict[int, int] = {}
    opened = {}

    def on_receiving(nodes: tuple[int, ...], now: bool) -> None:
        receiving.update(dict.fromkeys(nodes, now))

    def on_sending(nodes: tuple[int, ...], delta: int) -> None:
        for n in nodes:
            sending[n] = sending.get(n, 0) + delta

    async def on_local(node: int, ep) -> None:
        opened[node] = ep

    hooks = ControllerHooks(on_local=on_local, sending=on_sending, receiving=on_receiving)
    system = system_config("blitzscale")

    def scale_out(client, server, dest: int, copies: tuple[Copy, ...]) -> ScaleOutContext:
        return ScaleOutContext(
            client,
            server,
            manifest,
            system,
            (Destination(dest),),
            hooks,
            copies=copies,
            engine=EngineConfig(max_num_seqs=2),
            serve_while_loading=False,
        )

    async def run():
        every = list(range(manifest.num_blocks))
        client, server = await connected_server(cluster, manifest, {0: every})
        arrivals = client.subscribe((BlockArrived,), model=MODEL)
        try:
            first = scale_out(client, server, 1, (Copy(0, "gpu"),))
            task_a = asyncio.ensure_future(run_scale_out(first))
            # Node 1 is a chain tail once it receives and holds its first block.
            landed = False
            while not (receiving.get(1) and landed):
                got = [arrivals.get_nowait() for _ in range(arrivals.qsize())]
                landed = landed or any(e.node == 1 for e in got)
                await asyncio.sleep(0.01)
            assert not task_a.done() and sending == {0: 1}
            # What the controller offers now: node 0 sends (held egress), node 1 receives.
            copies = (Copy(0, "gpu", sending=1), Copy(1, "loading"))
            second = scale_out(client, server, 2, copies)
            plan = startup_plan(second)
            await run_scale_out(second)
            await task_a
            # Node 2 serves alone, token-exact.
            await server.retire(opened[1].name)
            req = server.new_request(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
            await server.submit(req)
            await server.wait_all(60)
            assert req.hops == [opened[2].name], req.hops
            return plan, second, req
        finally:
            client.unsubscribe(arrivals)
            await server.close()
            await client.close()

    plan, second, req = asyncio.run(run())
    # The tail, not the serving copy whose egress the first multicast holds (fails if the
    # start-up ignored the `loading` copy or the runtime could not pull from it).
    assert plan.sources == (Source(1, "loading"),)
    assert second.report.sources == (1,) and set(opened) == {1, 2}
    result = second.report.multicast
    assert result is not None and result.complete_s is not None
    assert all(a is not None for a in result.arrival_s[1])  # node 2 (plan node 1) has all
    # Every count went back: no instance is left marked busy or receiving.
    assert set(sending.values()) == {0} and not any(receiving.values())
    ref, logits = hf_greedy(tiny_hf, PROMPT, MAX_TOKENS)
    assert_same_tokens(req.output_token_ids, ref, logits, "node 2 via the chain tail")
