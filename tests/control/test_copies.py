"""Releasing a slot (`control/copies.py`) against a scripted agent client: a failing
`instance_close` does not skip the `evict`, and the pool forgets a GPU copy only once the
agent evicted it."""

import asyncio
from pathlib import Path

from surge.control.copies import Copies
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.runtime.protocol import EvictOp, InstanceCloseOp
from tests.control.scripted import ScriptedClient


def _copies(client: ScriptedClient, pool: ParameterPool) -> Copies:
    config = ControllerConfig(state_dir=Path("/nonexistent"))
    return Copies(client, pool, {}, config, lambda: [0, 1], started_s=0.0)  # type: ignore[arg-type]


def _pool_with_gpu_copy() -> ParameterPool:
    pool = ParameterPool()
    pool.add_model("m", 4)
    pool.add("m", 1, "gpu", range(4))
    pool.add("m", 1, "host", range(4))
    return pool


def test_a_failing_close_still_evicts_and_the_pool_follows() -> None:
    client, pool = ScriptedClient(failing=(InstanceCloseOp,)), _pool_with_gpu_copy()
    asyncio.run(_copies(client, pool).release_slot("m", 1, num_blocks=4))
    ops = [op for _, op in client.sent]
    assert ops == [
        InstanceCloseOp(instance="m-node1"),
        EvictOp(model="m", blocks=(0, 1, 2, 3), tier="gpu"),
    ]
    assert pool.blocks_at("m", 1, "gpu") == set()
    assert pool.complete("m", "host") == [1]  # the host copy stays


def test_a_failing_evict_leaves_the_gpu_copy_in_the_pool() -> None:
    client, pool = ScriptedClient(failing=(EvictOp,)), _pool_with_gpu_copy()
    asyncio.run(_copies(client, pool).release_slot("m", 1, num_blocks=4))
    assert pool.complete("m", "gpu") == [1]  # the agent still holds it


def test_a_down_node_is_not_called() -> None:
    client, pool = ScriptedClient(), _pool_with_gpu_copy()
    client.down.add(1)
    asyncio.run(_copies(client, pool).release_slot("m", 1, num_blocks=4))
    assert client.sent == []
