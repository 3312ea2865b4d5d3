"""FlexPipe's micro-batches (§7 Eq. 12): η in flight for η stages, bounded by the KV cache,
and the cache re-split among the head's groups when η changes, never below what a group
holds. The runtime's scale-out asks the same function the simulator does."""

from surge.config import EngineConfig
from surge.model.manifest import read_manifest
from surge.policy.flexpipe.microbatch import (
    flexpipe_micro_batches,
    micro_batch_budgets,
    micro_batch_limit,
    pipeline_micro_batches,
)
from surge.policy.systems import serve_system
from surge.runtime.scaleout.flexpipe import micro_batches


def test_eta_stages_keep_eta_micro_batches_up_to_the_kv_limit() -> None:
    assert [pipeline_micro_batches(n) for n in (1, 2, 4, 8)] == [1, 2, 4, 8]
    assert micro_batch_limit(16384, 2048) == 8 and micro_batch_limit(1000, 2048) == 1
    assert pipeline_micro_batches(8, limit=3) == 3 and pipeline_micro_batches(2, limit=3) == 2
    settings = serve_system("flexpipe").flexpipe  # stage counts up to 8, 2048-token groups
    assert flexpipe_micro_batches(settings, 4, 32, 16384) == (4, 8)
    assert flexpipe_micro_batches(settings, 4, 32, 4096) == (2, 2)
    assert flexpipe_micro_batches(settings, 4, 6, 16384) == (4, 6)  # finest: 6 layers


def test_the_runtime_head_of_a_four_stage_pipeline_keeps_four(tiny_store) -> None:
    """The scale-out's count for a new pipeline (fails if the head keeps λScale's 2)."""
    manifest = read_manifest(tiny_store)
    system = serve_system("flexpipe")
    finest = min(max(system.flexpipe.stage_counts), manifest.arch.num_layers)
    assert finest >= 4
    assert micro_batches(system, manifest, EngineConfig(), 4) == (4, finest)
    assert micro_batches(system, manifest, EngineConfig(), 1) == (1, finest)
    # A cache of two groups' minimum: at most two, whatever the stages.
    small = EngineConfig(max_kv_tokens=2 * system.flexpipe.min_group_kv_tokens)
    assert micro_batches(system, manifest, small, 4) == (2, 2)


def test_budgets_split_evenly_and_never_cut_below_held() -> None:
    # Two fresh groups of a 100-page cache.
    assert micro_batch_budgets(100, [], [], 2) == (50, 50)
    # A split 1 -> 4: the old group holds 40 of its 100; the new ones share the rest.
    b = micro_batch_budgets(100, [40], [100], 4)
    assert len(b) == 4 and sum(b) == 100 and b[0] == 40 and min(b[1:]) == 20
    # It held little: every group gets its even share.
    assert micro_batch_budgets(100, [5], [100], 4) == (25, 25, 25, 25)
    # A merge 4 -> 1: groups past the count keep their budget while they hold pages
    # (their sequences still grow), a drained one gives its pages back.
    b = micro_batch_budgets(100, [10, 20, 0, 3], [25, 25, 25, 25], 1)
    assert b == (50, 25, 0, 25)
    assert micro_batch_budgets(100, [10, 0, 0, 0], [50, 25, 0, 25], 1) == (100, 0, 0, 0)
