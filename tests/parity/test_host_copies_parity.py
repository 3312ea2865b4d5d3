"""Pinned host copy parity: models of different sizes deployed one after another onto the
same empty nodes keep their pinned host copies on the same nodes in `surge serve`
(`control/copies.Copies.restore_invariant`, at creation) and in the simulator
(`sim/host_cache.HostCache.seed`, at time 0): both ask `policy.copies.host_copies.kept_copies`
with the system's `host_cache`. BlitzScale §5.3 (`pinned-one`) and λScale (`pinned-lru`): one
copy, on the roomiest node (ties to the lowest id); FlexPipe (`all`): every node; ParaServe
(`none`) and ServerlessLLM (`lru`): none, so their first start is cold from the registry or
the SSD.
Node i of the runtime is machine i."""

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from surge.control.copies import Copies
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.policy.systems import serve_system, system_config
from surge.runtime.protocol import Ack, LoadOp, Op
from tests.parity.sim_world import simulation

NUM_MACHINES = 3
BLOCKS = 4


class AckingClient:
    """Every op succeeds (the agents load what they are told)."""

    def __init__(self) -> None:
        self.down: set[int] = set()
        self.host_loads: list[tuple[str, int]] = []

    async def call(self, node: int, op: Op) -> Any:
        if isinstance(op, LoadOp) and op.tier == "host":
            self.host_loads.append((op.model, node))
        return Ack()


def _runtime_pins(strategy: str, sizes: list[int]) -> tuple[list[list[int]], list[tuple[str, int]]]:
    """Each model's pinned nodes after its creation, and the host loads the agents were
    asked for."""
    pool, deployments = ParameterPool(), {}
    config = ControllerConfig(state_dir=Path("/nonexistent"))
    client = AckingClient()
    copies = Copies(
        client,  # type: ignore[arg-type]
        pool,
        deployments,  # type: ignore[arg-type]
        config,
        lambda: list(range(NUM_MACHINES)),
        started_s=0.0,
    )
    pins: list[list[int]] = []

    async def deploy_all() -> None:
        for i, nbytes in enumerate(sizes):
            name = "tiny" if i == 0 else f"tiny{i}"
            pool.add_model(name, BLOCKS)
            dep = SimpleNamespace(
                name=name,
                manifest=SimpleNamespace(total_bytes=nbytes, num_blocks=BLOCKS),
                instances={},
                host_last_used_s={},
                pinned_nodes=set(),
                spec=SimpleNamespace(strategy=strategy, system=serve_system(strategy)),
                restoring=False,
                num_scale_outs=0,
                failure=None,
                spawn=asyncio.ensure_future,
            )
            deployments[name] = dep
            await copies.restore_invariant(dep)  # type: ignore[arg-type]
            await asyncio.sleep(0)
            pins.append(sorted(dep.pinned_nodes))

    asyncio.run(deploy_all())
    return pins, client.host_loads


SYSTEMS = ("blitzscale", "lambdascale", "flexpipe", "paraserve", "serverlessllm")


@pytest.mark.parametrize("strategy", SYSTEMS)
@pytest.mark.parametrize(
    "layers",
    [(8, 8, 8), (16, 2, 2, 2), (2, 16, 2, 2, 4), (8, 8, 8, 8)],
    ids=["equal", "one large then small", "mixed", "more models than nodes"],
)
def test_both_bodies_keep_each_models_copies_on_the_same_nodes(
    strategy: str, layers: tuple[int, ...], tmp_path
) -> None:
    system = system_config(strategy)
    sim = simulation(tmp_path, system, NUM_MACHINES, "registry", layers, True)
    sim_pins = []
    for slot in sim.world.models:
        held = [m for m, cache in enumerate(sim.world.state.host_cache) if slot.name in cache]
        assert all(sim.world.state.host_cache[m][slot.name].pinned for m in held)
        sim_pins.append(held)
    sizes = [slot.profile.total_bytes for slot in sim.world.models]
    runtime_pins, loads = _runtime_pins(strategy, sizes)
    assert runtime_pins == sim_pins
    # the runtime loaded exactly the copies it pinned (nothing was there before)
    names = ["tiny" if i == 0 else f"tiny{i}" for i in range(len(layers))]
    pairs = zip(names, sim_pins, strict=True)
    assert sorted(loads) == sorted((n, m) for n, held in pairs for m in held)
    one = {"pinned-one": 1, "pinned-lru": 1}
    wanted = {**one, "all": NUM_MACHINES, "none": 0, "lru": 0}[system.host_cache]
    assert [len(p) for p in sim_pins] == [wanted] * len(layers)
    if system.host_cache in one and len(set(layers)) > 1:
        # the sizes matter: a rule by model index alone would pin elsewhere
        assert [p[0] for p in sim_pins] != [i % NUM_MACHINES for i in range(len(layers))]
