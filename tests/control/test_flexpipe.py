"""FlexPipe through the controller: the granularity loop, not a static pipeline.

One coarse pipeline serves (one stage, no arrivals yet). A burst (two clumps of requests:
inter-arrival CV ~3, more than the pipeline's target, so some wait at the router) makes
the loop split it into two stages on two nodes while the requests generate; a quiet
period (nothing waits, the load fits one stage) makes it merge back to one stage. Both
show in `/metrics` (`surge_pipeline_refactors_total{direction}`) and in the deployment
status that `surge status` prints; every request matches a local greedy run.
A static pipeline (no split, or no merge) fails this test.
"""

import asyncio
from dataclasses import replace

from surge.control.controller import Controller, ControllerConfig
from surge.engine.sampling import SamplingParams
from surge.events import BlockLanded, Refactor
from surge.model.tokenizer import load_tokenizer
from surge.policy.flexpipe.settings import FlexPipeSettings
from surge.policy.systems import SYSTEMS
from surge.runtime.migration.refactor import FlexPipeline
from tests.control.strategy_run import PROMPTS, check_tokens, deploy, local_cluster, wait_until

MAX_TOKENS = 240
"""Long enough that the split (blocks loaded on the second node, stages opened) lands while
every request still generates: the agents' steps are paced (`strategy_run.PACE`), so the
burst's 240 tokens last >= 4.8 s on a host of any speed; the split came ~1.3 s after the
burst (63-72 tokens in, 2 runs at load 3-6; 67 at load 6-7 with 240: a 3.5x margin). 400
tokens (until Nov 28) gave the same split and merge and took ~11 s longer: the burst ran
~25 s from the split to its end, against ~14 s. Unpaced, the test needed 1,200 tokens (on a
quiet 2-core VM the split came at ~140 of 400; on the Nov 24 host with surge's one-row
kernel all 400 were done before it): 40 s and 25.6 s of CPU against 28 s and 14.3 s paced
(same load)."""


def _refactors(metrics_text: str, direction: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith("surge_pipeline_refactors_total{") and f'"{direction}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _done(dep, direction: str) -> bool:
    """A refactoring in `direction` completed (counted once the switch is over)."""
    return dep.flexpipe is not None and dep.flexpipe.refactors.get(direction, 0) >= 1


def _stage_counts(dep) -> list[int]:
    return [len(e.stages) for e in dep.server.endpoints.values() if isinstance(e, FlexPipeline)]


def _micro_batches(dep) -> list[int]:
    """Head engines taking requests, per pipeline (η for η stages, §7 Eq. 12)."""
    return [
        e.num_micro_batches for e in dep.server.endpoints.values() if isinstance(e, FlexPipeline)
    ]


def test_burst_splits_and_quiet_merges_live_pipeline(
    tmp_path, tiny_store_dir, reference, monkeypatch
) -> None:
    # A short window and interval so the test takes seconds (defaults: 30 s, 1 s); the
    # controller reads them from the system, as the runtime's scale-out does.
    # No hop cost: on loopback a tiny model loads in milliseconds, so with the system's 1-ms
    # hop per token `useful_stages` would keep one stage (splitting would not pay); this
    # test is about the loop, so hops are made free and Eq. 4's choice stands.
    fast = FlexPipeSettings(cv_window_s=2.0, decision_interval_s=0.2)
    # No host copy ahead of use (FlexPipe's own `host_cache` `all` puts one on every node at
    # creation): what puts the merged-away stage's blocks in its host tier is then §7's keep.
    system = replace(SYSTEMS["flexpipe"], flexpipe=fast, stage_hop_s=0.0, host_cache="none")
    monkeypatch.setitem(SYSTEMS, "flexpipe", system)
    tok = load_tokenizer(tiny_store_dir / "tokenizer.json")
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=2, paced=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)

    async def run():
        ctl = Controller(
            ControllerConfig(state_dir=state, nodes=2), cluster.addresses, cluster.token
        )
        await ctl.start()
        seen = ctl.events.subscribe()  # what the dashboard would draw
        try:
            # a target of 3: one stage takes 4 (`PACK_MAX_OVER_TARGET`), two stages all 8
            scaling = {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 3}
            dep = await deploy(ctl, tiny_store_dir, "flexpipe", scaling)
            await wait_until(lambda: _stage_counts(dep) == [1], "a coarse pipeline")
            coarse_nodes = sorted(dep.instances)
            coarse_micro = _micro_batches(dep)
            reqs = []
            for clump in (PROMPTS[:4], PROMPTS[4:]):  # a burst: two clumps 0.5 s apart
                reqs += await asyncio.gather(
                    *(ctl.submit(dep, tok.encode(p).ids, params) for p in clump)
                )
                await asyncio.sleep(0.5)
            await wait_until(lambda: _done(dep, "split") and _stage_counts(dep) == [2], "split", 30)
            split_status = ctl.describe(dep)["status"]
            split_micro = _micro_batches(dep)
            mid = [len(r.output_token_ids) for r in reqs]
            split_nodes = sorted(dep.instances)
            await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 120)
            await wait_until(lambda: _done(dep, "merge") and _stage_counts(dep) == [1], "merge", 30)
            await wait_until(lambda: len(dep.instances) == 1, "the merged-away slot released")
            (left,) = [n for n in split_nodes if n not in dep.instances]
            # FlexPipe §7: its stage's blocks stay in its host tier (announced as arrivals)
            kept = lambda: ctl.pool.blocks_at(dep.name, left, "host")  # noqa: E731
            await wait_until(lambda: bool(kept()), "the merged-away stage kept in host", 10)
            held = (kept(), ctl.pool.blocks_at(dep.name, left, "gpu"))
            return (
                left,
                held,
                (coarse_micro, split_micro, _micro_batches(dep)),
                reqs,
                mid,
                coarse_nodes,
                split_nodes,
                split_status,
                ctl.describe(dep)["status"],
                ctl.metrics.render().decode(),
                [seen.queue.get_nowait() for _ in range(seen.queue.qsize())],
            )
        finally:
            await ctl.stop()

    with cluster:
        (
            left,
            (kept, left_gpu),
            micro,
            reqs,
            mid,
            coarse_nodes,
            split_nodes,
            split_status,
            status,
            metrics,
            events,
        ) = asyncio.run(run())
    # The head keeps one micro-batch per stage through both refactorings (the policy's
    # count, as in the simulator): 1, then 2 once split, 1 again once merged.
    assert micro == ([1], [2], [1]), micro
    check_tokens(reqs, tok, reference, MAX_TOKENS)
    assert len(coarse_nodes) == 1 and len(split_nodes) == 2
    assert any(0 < n < MAX_TOKENS for n in mid), mid  # the split came mid-generation
    assert split_status["flexpipe"]["refactors"]["split"] >= 1, split_status
    assert status["flexpipe"]["refactors"]["merge"] >= 1, status
    assert [len(p["stages"]) for p in status["flexpipe"]["pipelines"]] == [1]
    assert _refactors(metrics, "split") >= 1 and _refactors(metrics, "merge") >= 1, metrics
    assert all(len(r.hops) == 1 for r in reqs), [r.hops for r in reqs]  # none re-routed
    # The dashboard sees both refactorings, with the new stages' nodes.
    shapes = [len(e.stages) for e in events if isinstance(e, Refactor)]
    assert shapes[:2] == [2, 1], shapes
    # FlexPipe §7 host copies kept after GPU eviction: the node merged away freed its GPU
    # copy, and its stage's blocks landed in its host tier after the merge (GPU -> host), so
    # a later stage there loads warm (`policy.flexpipe.host_keep.stage_sources`).
    merge_at = [i for i, e in enumerate(events) if isinstance(e, Refactor)][1]
    landed = [
        e.block
        for e in events[merge_at:]
        if isinstance(e, BlockLanded) and e.node == left and e.tier == "host"
    ]
    assert landed and set(landed) <= kept and not left_gpu, (left, landed, kept, left_gpu)
