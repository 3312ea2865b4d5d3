"""The strategies' own mechanisms inside the controller, token-exact against a local greedy
run: `paraserve` consolidates its pipeline group by KV migration (ParaServe §6) and
`blitzscale` prefills queued requests cooperatively while a new instance loads (BlitzScale
live scaling, §4). Agents run on loopback with slow links so the overlap is real."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from surge.control.controller import Controller, ControllerConfig, Deployment, TrackedRequest
from surge.engine.sampling import SamplingParams
from surge.model.tokenizer import load_tokenizer
from surge.runtime.launcher import LocalCluster, LocalClusterConfig
from tests.control.test_serve_openai import MODEL

PROMPTS = [f"Tale {i}: a model wakes up" for i in range(8)]


async def _run_burst(
    ctl: Controller, dep: Deployment, tok, max_tokens: int
) -> list[TrackedRequest]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    reqs = [await ctl.submit(dep, tok.encode(p).ids, params) for p in PROMPTS]
    await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 120)
    return reqs


def _cluster(state: Path, **kw) -> LocalCluster:
    (state / "registry").mkdir(parents=True, exist_ok=True)
    return LocalCluster(LocalClusterConfig(num_nodes=2, remote_dir=state / "registry", **kw))


def _check(reqs: list[TrackedRequest], tok, reference: Callable, max_tokens: int) -> None:
    for p, r in zip(PROMPTS, reqs, strict=True):
        assert tok.decode(r.output_token_ids) == reference(p, max_tokens), (p, r.hops)


def test_paraserve_consolidates_by_kv_migration(tmp_path, tiny_store_dir, reference) -> None:
    """Two nodes fetch half the model each (one from its host copy, one from a slow
    registry), serve as one pipeline group, fetch the rest, then the running requests move
    with their KV caches onto both new instances and decode on."""
    tok = load_tokenizer(tiny_store_dir / "tokenizer.json")
    state = tmp_path / "state"
    cluster = _cluster(state, remote_gbps=0.02)  # ~0.8 s per half of the 4 MB model

    async def run():
        ctl = Controller(
            ControllerConfig(state_dir=state, nodes=2), cluster.addresses, cluster.token
        )
        await ctl.start()
        try:
            dep = await ctl.create(
                {
                    "name": MODEL,
                    "model": str(tiny_store_dir),
                    "strategy": "paraserve",
                    "autoscaling": {"target_ongoing_requests": 4, "keep_alive_s": 60},
                }
            )
            reqs = await _run_burst(ctl, dep, tok, 320)
            return reqs, ctl.describe(dep)["status"]
        finally:
            await ctl.stop()

    with cluster:
        reqs, status = asyncio.run(run())
    _check(reqs, tok, reference, 320)
    assert status["kv_migrated"] >= 1, status
    moved = [r for r in reqs if "-pgroup-" in r.hops[0] and len(r.hops) > 1]
    assert moved and all(h.startswith(f"{MODEL}-node") for r in moved for h in r.hops[1:])


def test_blitzscale_live_scaling_while_the_new_instance_loads(
    tmp_path, tiny_store_dir, reference
) -> None:
    """One instance serves and is overloaded (one request at a time); the second loads over a
    slow link, and queued requests are prefilled with their first layers on it and the rest
    on the old instance, which decodes them."""
    tok = load_tokenizer(tiny_store_dir / "tokenizer.json")
    state = tmp_path / "state"
    cluster = _cluster(state, link_gbps=0.05)  # ~0.7 s to multicast the model

    async def run():
        cfg = ControllerConfig(state_dir=state, nodes=2, max_num_seqs=1)
        ctl = Controller(cfg, cluster.addresses, cluster.token)
        await ctl.start()
        try:
            dep = await ctl.create(
                {
                    "name": MODEL,
                    "model": str(tiny_store_dir),
                    "strategy": "blitzscale",
                    "autoscaling": {
                        "min_replicas": 1,
                        "target_ongoing_requests": 1,
                        "keep_alive_s": 60,
                        "downscale_delay_s": 60,
                    },
                }
            )
            deadline = time.monotonic() + 60
            while not dep.serving():
                assert time.monotonic() < deadline, "no first instance"
                await asyncio.sleep(0.05)
            reqs = await _run_burst(ctl, dep, tok, 256)
            return reqs, ctl.describe(dep)["status"]
        finally:
            await ctl.stop()

    with cluster:
        reqs, status = asyncio.run(run())
    _check(reqs, tok, reference, 256)
    assert status["live_prefilled"] >= 1, status
    live = [r for r in reqs if any(h.startswith("live-") for h in r.hops)]
    assert live and all(r.hops[-1].startswith(f"{MODEL}-node") for r in live)
