"""FlexPipe micro-batch parity (§7 Eq. 12): a pipeline of η stages whose cache holds the
same number of tokens keeps the same number of micro-batches in flight in `surge serve`
(`runtime/scaleout/flexpipe.micro_batches`, the count the scale-out and the controller's
refactorings give the head) and in the simulator (`sim/flexpipe.FlexPipe.register`, the
count its instance steps with and the batch limit it takes): both carry out
`policy.flexpipe.microbatch.flexpipe_micro_batches`, η bounded by the cache. The bounded
cases fail if either body keeps η whatever its cache (the simulator's own rule before)."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from surge.policy.flexpipe.microbatch import flexpipe_micro_batches
from surge.policy.systems import system_config
from surge.runtime.scaleout import flexpipe as runtime_flexpipe
from tests.parity.sim_world import instance_on, simulation

NUM_LAYERS = 8
SYSTEM = replace(system_config("flexpipe"), num_blocks=NUM_LAYERS)
GROUP_TOKENS = SYSTEM.flexpipe.min_group_kv_tokens


def _runtime_count(eta: int, kv_tokens: int) -> int:
    manifest = SimpleNamespace(arch=SimpleNamespace(num_layers=NUM_LAYERS))
    engine = SimpleNamespace(max_kv_tokens=kv_tokens)
    micro, _ = runtime_flexpipe.micro_batches(SYSTEM, manifest, engine, eta)  # type: ignore[arg-type]
    return micro


def _sim_count(eta: int, kv_tokens: int, tmp_path) -> tuple[int, int]:
    """(micro-batches the simulator's instance steps with, its batch limit in units of
    `SimSettings.max_batch`)."""
    sim = simulation(tmp_path, SYSTEM, eta, "registry", (NUM_LAYERS,))
    inst = instance_on(sim, 0, serving=True)
    inst.kv_capacity_tokens = kv_tokens
    per = NUM_LAYERS // eta
    spans = tuple(
        (sim.world.state.machines[m].first_gpu, (m * per, (m + 1) * per)) for m in range(eta)
    )
    sim.flexpipe.register(inst, spans)
    return inst.micro_batches, inst.max_batch // sim.world.settings.max_batch


@pytest.mark.parametrize(
    "eta,kv_groups",
    [(1, 8), (2, 8), (4, 8), (8, 8), (4, 2), (8, 3), (8, 1), (4, 0)],
    ids=[
        "one stage",
        "two stages",
        "four stages",
        "eight stages",
        "four stages, cache for two groups",
        "eight stages, cache for three groups",
        "eight stages, cache for one group",
        "four stages, cache under one group",
    ],
)
def test_both_bodies_keep_the_same_micro_batches_in_flight(
    eta: int, kv_groups: int, tmp_path
) -> None:
    kv_tokens = kv_groups * GROUP_TOKENS if kv_groups else GROUP_TOKENS // 2
    runtime = _runtime_count(eta, kv_tokens)
    sim, batches = _sim_count(eta, kv_tokens, tmp_path)
    assert sim == runtime
    assert batches == runtime  # the head's capacity: one batch per micro-batch group
    assert runtime == flexpipe_micro_batches(SYSTEM.flexpipe, eta, NUM_LAYERS, kv_tokens)[0]
    assert runtime == min(eta, max(1, kv_groups))  # the bounded cases bound
