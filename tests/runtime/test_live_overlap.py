"""BlitzScale §4-§5 live scaling on real agents, as Fig. 12b draws it: the zigzag ILP's
schedule is the one carried out, the target starts a batch's first layers before the
source has finished an earlier batch's rest (batches under way at once, not one after
another; the source's GPU also steps its own request, `StepPacer.step`),
and a batch waiting for layers starts when the block that brings them lands (§5.2 (2)
preemption), not at the next poll. Steps are paced by the GPU-time emulation so each
stage's compute lasts long enough to see who worked on what when."""

import asyncio
import time
from dataclasses import replace

import pytest

from surge.emulation import Emulation, EmulationConfig
from surge.engine.sampling import SamplingParams
from surge.policy.systems import system_config
from surge.runtime.protocol import LoadOp
from surge.runtime.scaleout.live import LiveScaling
from tests.runtime.conftest import MODEL
from tests.runtime.test_consolidation import connected_server
from tests.runtime.test_emulation import SPEC
from tests.runtime.test_live_scaling import live_context, one_at_a_time_on_node0
from tests.runtime.test_serving import check_against_reference

MAX_TOKENS = 4
D = 16.0
"""Time dilation: a stage's paced prefill (tens of ms at D=1) outlasts opening the next
batch's stages and the hidden states' hop to the source."""
LONG_PROMPTS = [
    [0, *(2 + (7 * i + k) % 500 for i in range(n))] for k, n in enumerate((200, 160, 180))
]


Span = tuple[int, float, float]


def _under_way_together(earlier: tuple[Span, ...], later: tuple[Span, ...]) -> bool:
    """The target's part of `later` started after `earlier`'s and before the source had
    finished `earlier`'s (spans: (node, start, end), target first)."""
    return earlier[0][1] < later[0][1] < earlier[1][2]


@pytest.mark.serial  # asserts wall-clock time: alone on the CPU (pyproject)
def test_zigzag_batches_overlap_across_target_and_source_and_wake_on_a_layer(
    make_cluster, manifest, tiny_hf
) -> None:
    """Node 0 serves one request at a time; node 1 holds layer 0 of 4 and goes live.
    Time_l = 2 (the fallback: no block has landed yet) and >= 4 batches of 2: the ILP's
    schedule (1,3), (1,3), (2,2), ... beats best effort, so batches 1 and 2 run with one
    layer on node 1 while batch 3 waits for layer 1, which this test then loads."""
    emulation = Emulation.for_store(EmulationConfig.parse(SPEC, D), manifest)
    cluster = make_cluster(2, emulation=emulation, preload_engine=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    system = replace(system_config("blitzscale"), live_batch=2, live_load_ratio=2.0)

    async def run():
        every = list(range(manifest.num_blocks))
        client, server = await connected_server(cluster, manifest, {0: every, 1: [0]})
        try:
            reqs = await one_at_a_time_on_node0(client, server, LONG_PROMPTS * 6, params)
            ctx = live_context(client, server, manifest, system, ttft_slo_s=0.01)
            held = {1: {0}}
            live = LiveScaling(ctx, held)
            live.go_live(1)
            task = live.start()
            deadline = time.monotonic() + 60
            while sum(ctx.report.live_batches.values()) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # batch 3 now waits for layer 1 (polls come and go)
            waited = sum(ctx.report.live_batches.values())
            load = LoadOp(model=MODEL, blocks=(1,), tier="gpu", source="remote")
            await client.call(1, load)
            landed = time.monotonic()
            live.arrived(1, 1, time.time())  # as the multicast reports it, then holds it
            held[1].add(1)
            while sum(ctx.report.live_batches.values()) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            third = time.monotonic()
            await live.stop(task)
            await server.wait_all(60)
            return reqs, ctx, waited, third - landed
        finally:
            await server.close()
            await client.close()

    reqs, ctx, waited, third_after_s = asyncio.run(run())
    report = ctx.report
    # The ILP's branch is the one that ran (not best effort).
    assert report.live_batches.get("zigzag", 0) >= 2, report.live_batches
    # Batches were under way together: the target (node 1) started a later batch before
    # the source (node 0) had finished an earlier one's last layers (one after another, it
    # would wait for that batch's first tokens). Node 0 also steps its own request, one GPU:
    # the source's part may wait for that step (`StepPacer.step`), so the target's next
    # batch may be done by then (node 0's own steps last ~0.1 s here, a target step ~0.05).
    spans = report.live_spans
    assert len(spans) >= 3
    crossed = [
        (i, j)
        for i, (_, _, a) in enumerate(spans)
        for j, (_, _, b) in enumerate(spans)
        if i != j and _under_way_together(a, b)
    ]
    assert all(s[0][0] == 1 and s[1][0] == 0 for _, _, s in spans)
    assert crossed, spans
    # Batch 3 waited for layer 1 (the poll did not run it) and ran when it landed.
    assert waited == 2 and report.live_woken >= 1
    assert third_after_s < 5.0
    check_against_reference(tiny_hf, reqs, MAX_TOKENS)
