"""Pinned host copy parity (BlitzScale §5.3): models of different sizes deployed one after
another onto the same empty nodes get their pinned host copy on the same node in
`surge serve` (`control/copies.Copies.restore_invariant`) and in the simulator
(`sim/host_cache.HostCache.seed`, `pinned-one`): both ask `policy.copies.host_copies.pinned_copy`
(the roomiest node, ties to the lowest id). Node i of the runtime is machine i."""

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from surge.control.copies import Copies
from surge.control.pool import ParameterPool
from surge.control.settings import ControllerConfig
from surge.policy.systems import system_config
from surge.runtime.protocol import Ack, Op
from tests.parity.sim_world import simulation

NUM_MACHINES = 3
BLOCKS = 4


class AckingClient:
    """Every op succeeds (the agents load what they are told)."""

    def __init__(self) -> None:
        self.down: set[int] = set()

    async def call(self, node: int, op: Op) -> Any:
        return Ack()


def _runtime_pins(layers: tuple[int, ...], sizes: list[int]) -> list[int]:
    pool, deployments = ParameterPool(), {}
    config = ControllerConfig(state_dir=Path("/nonexistent"))
    copies = Copies(
        AckingClient(),  # type: ignore[arg-type]
        pool,
        deployments,  # type: ignore[arg-type]
        config,
        lambda: list(range(NUM_MACHINES)),
        started_s=0.0,
    )
    pins: list[int] = []

    async def deploy_all() -> None:
        for i, nbytes in enumerate(sizes):
            name = "tiny" if i == 0 else f"tiny{i}"
            pool.add_model(name, BLOCKS)
            dep = SimpleNamespace(
                name=name,
                manifest=SimpleNamespace(total_bytes=nbytes, num_blocks=BLOCKS),
                instances={},
                host_last_used_s={},
                pinned_node=None,
                restoring=False,
                num_scale_outs=0,
                failure=None,
                spawn=asyncio.ensure_future,
            )
            deployments[name] = dep
            await copies.restore_invariant(dep)  # type: ignore[arg-type]
            pins.append(dep.pinned_node)

    asyncio.run(deploy_all())
    return pins


@pytest.mark.parametrize(
    "layers",
    [(8, 8, 8), (16, 2, 2, 2), (2, 16, 2, 2, 4), (8, 8, 8, 8)],
    ids=["equal", "one large then small", "mixed", "more models than nodes"],
)
def test_both_bodies_pin_each_model_on_the_same_node(layers: tuple[int, ...], tmp_path) -> None:
    sim = simulation(tmp_path, system_config("blitzscale"), NUM_MACHINES, "registry", layers, True)
    sim_pins = []
    for slot in sim.world.models:
        held = [m for m, cache in enumerate(sim.world.state.host_cache) if slot.name in cache]
        assert len(held) == 1  # one pinned copy per model
        assert sim.world.state.host_cache[held[0]][slot.name].pinned
        sim_pins.append(held[0])
    sizes = [slot.profile.total_bytes for slot in sim.world.models]
    assert _runtime_pins(layers, sizes) == sim_pins
    if len(set(layers)) > 1:
        # the sizes matter: a rule by model index alone would pin elsewhere
        assert sim_pins != [i % NUM_MACHINES for i in range(len(layers))]
