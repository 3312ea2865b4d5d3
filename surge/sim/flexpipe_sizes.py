"""What a FlexPipe decision reads from the simulated world about one model: its layer
profile (`policy.flexpipe.system.LayerProfile`), the bytes a GPU slot holds and a stage
takes, §7 Eq. 12's load time of a new group from the best tier its free GPUs hold, and the
waiting requests' mean output length.

In: the `World` (models, node groups, host caches, links) and a `Pool`. Out: numbers and
profiles for `sim.flexpipe.FlexPipe` to hand to the policy (`policy/flexpipe`)."""

from surge.policy.flexpipe.scaling_load import TierRates, new_group_load_s
from surge.policy.flexpipe.system import LayerProfile
from surge.policy.placement import MIN_KV_FRACTION, WEIGHT_HEADROOM
from surge.sim.costs import cost_model
from surge.sim.pools import Pool
from surge.sim.world import World

PROFILE_PROMPT_TOKENS = 512
"""Prompt length of the layer profile (prefill time, activation bytes)."""
PROFILE_BATCH = 8
"""Decode batch of the layer profile."""


def layer_profile(world: World, model: int) -> LayerProfile:
    """One layer of `model` on its node group's GPU: prefill and decode seconds, bytes."""
    slot = world.models[model]
    prof = slot.profile
    cost = cost_model(prof, slot.group.gpu, 1)
    return LayerProfile(
        num_layers=prof.num_layers,
        prefill_s=cost.prefill_s(PROFILE_PROMPT_TOKENS, layers=1),
        decode_s=cost.decode_s(PROFILE_BATCH, layers=1),
        param_bytes=prof.layer_bytes,
        activation_bytes=prof.hidden_size * prof.dtype_bytes * PROFILE_PROMPT_TOKENS,
        hop_s=world.system.stage_hop_s,
    )


def slot_bytes(world: World, model: int) -> int:
    """The weight bytes one GPU of `model`'s node group holds as a stage slot."""
    group = world.models[model].group
    per_gpu = group.gpu.memory_bytes * world.settings.kv_memory_fraction
    return int(per_gpu * (1 - MIN_KV_FRACTION) / WEIGHT_HEADROOM)


def stage_bytes(world: World, model: int, bounds: tuple[tuple[int, int], ...]) -> list[int]:
    """The bytes each stage of `model` cut at `bounds` fetches (the first the embedding too)."""
    prof = world.models[model].profile
    out = [(b - a) * prof.layer_bytes for a, b in bounds]
    out[0] += prof.embedding_bytes
    return out


def group_load_s(world: World, pool: Pool) -> float:
    """§7 Eq. 12's S_j: the whole model from the best tier the free GPUs of the model's
    node group hold (`new_group_load_s`: host memory where the machine's host cache
    holds it, else the model store), a stage of m loads 1/m of it."""
    slot = world.models[pool.model]
    grp = slot.group
    store = "disk" if grp.model_store == "ssd" else "remote"
    own = [m for m in world.state.machines if m.group is grp and world.state.has_free(m)]
    warm = world.system.load == "allcache"
    tiers = ["host" if warm or slot.name in world.state.host_cache[m.index] else store for m in own]
    fetch = world.state.fetch_gbps(own[0].index) if own else grp.nic_gbps
    rates = TierRates(grp.pcie_gbps, grp.ssd_gbps, fetch)
    return new_group_load_s(slot.profile.total_bytes, tiers, rates)


def decode_steps(pool: Pool) -> float | None:
    """The waiting requests' mean output length (None when none waits)."""
    if not pool.queue:
        return None
    return sum(r.output_tokens for r in pool.queue) / len(pool.queue)
