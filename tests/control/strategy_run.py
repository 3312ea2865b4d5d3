"""What the tests of each strategy inside `surge serve`'s controller share: loopback agents
(`local_cluster`), the test model's deployment (`deploy`), a burst submitted at once
(`run_burst`), a bounded wait (`wait_until`) and the tokens checked against a local greedy
run (`check_tokens`). Used by test_strategies.py, test_flexpipe.py, test_blitzscale_pd.py,
test_host_cache_modes.py and test_multicast_topology_serve.py.
"""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from surge.control.controller import Controller
from surge.control.state import Deployment, TrackedRequest
from surge.engine.sampling import SamplingParams
from surge.runtime.client import ClusterClient
from surge.runtime.launch.local import LocalCluster, LocalClusterConfig
from surge.runtime.protocol import StatusOp, StatusReply
from tests.control.conftest import Reference
from tests.control.test_serve_openai import MODEL

PROMPTS = [f"Tale {i}: a model wakes up" for i in range(8)]

PACE = ["--emulate", "flexpipe:llama2-13b", "--emulated-gpu", "A100"]
"""Agent flags (`local_cluster(..., paced=True)`): every engine step lasts what llama2-13b
takes on FlexPipe's A100s (§9, `emulation/pacing.py`), ~20 ms a decode step, on a host of
any speed. For a test whose requests must outlast something (test_flexpipe: the split): the
agents sleep through a step instead of computing many more tokens, and the tokens are the
same."""


async def run_burst(
    ctl: Controller, dep: Deployment, tok, max_tokens: int, prompts: list[str] = PROMPTS
) -> list[TrackedRequest]:
    """Submit `prompts` at once to `dep` and wait (120 s at most) until all are done."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    # All at once: the autoscaler's next tick sees the whole burst (one scale-out).
    reqs = await asyncio.gather(*(ctl.submit(dep, tok.encode(p).ids, params) for p in prompts))
    await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in reqs)), 120)
    return reqs


async def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Poll `cond` until true; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def deploy(
    ctl: Controller, store: Path, strategy: str, autoscaling: dict, **spec: dict
) -> Deployment:
    """Create the test model's deployment with this strategy (instances kept for 60 s)."""
    autoscaling = {"keep_alive_s": 60, "downscale_delay_s": 60, **autoscaling}
    body = {"name": MODEL, "model": str(store), "strategy": strategy, **spec}
    return await ctl.create({**body, "autoscaling": autoscaling})


async def agent_statuses(cluster: LocalCluster) -> dict[int, StatusReply]:
    """Each agent's `status`, asked directly (not through a controller)."""
    client = ClusterClient(cluster.addresses, cluster.token)
    await client.connect()
    try:
        return await client.broadcast(StatusOp())
    finally:
        await client.close()


def local_cluster(state: Path, num_nodes: int = 2, paced: bool = False, **kw) -> LocalCluster:
    """Loopback agents reading the registry under `state` (start it with `with`); `paced`:
    their engine steps paced (`PACE`)."""
    (state / "registry").mkdir(parents=True, exist_ok=True)
    if paced:
        kw["extra_args"] = dict.fromkeys(range(num_nodes), PACE)
    return LocalCluster(
        LocalClusterConfig(num_nodes=num_nodes, remote_dir=state / "registry", **kw)
    )


def check_tokens(
    reqs: list[TrackedRequest], tok, reference: Reference, max_tokens: int, prompts=PROMPTS
) -> None:
    """Each request's text is the local greedy run's for its prompt."""
    wanted = reference.many(prompts, max_tokens)  # one batched run for the whole burst
    for p, r, want in zip(prompts, reqs, wanted, strict=True):
        assert tok.decode(r.output_token_ids) == want, (p, r.hops)
