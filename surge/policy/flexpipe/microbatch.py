"""FlexPipe's micro-batches: how many a pipeline keeps in flight, and how its KV is split.

In: a pipeline's stage count η, its stages' KV cache (tokens or pages) and what each
micro-batch group holds now. Out:
- `micro_batch_limit`: the most micro-batch groups a KV cache of `max_kv_tokens` can
  give each at least `min_group_kv_tokens` (FlexPipe's `FlexPipeSettings`);
- `pipeline_micro_batches`: η micro-batches in flight for η stages (§7 Eq. 12: a
  pipeline serves the sum of its stages' throughputs, Σ_k μ_jk, when every stage works
  on one micro-batch), at most the limit;
- `flexpipe_micro_batches`: a FlexPipe pipeline's count, the decision both bodies take
  through this one call: η for η stages, bounded by its cache (`micro_batch_limit`);
- `micro_batch_budgets`: the KV pages each group may hold after the count changed (a
  refactoring, §6): groups past the count drain with what they have, the others share
  the rest as evenly as their held pages allow.
The simulator (`sim/flexpipe.py`, `Instance.set_micro_batches`) and the runtime's
pipeline head (`runtime/pipeline_endpoint.py` `PipelineEndpoint`, set by the FlexPipe scale-out
and the controller's refactorings) both take their count from `flexpipe_micro_batches`
(`tests/parity/test_flexpipe_micro_batches_parity.py`). Pure and deterministic.
"""

from collections.abc import Sequence

from surge.errors import SurgeError
from surge.policy.flexpipe.settings import FlexPipeSettings


def micro_batch_limit(max_kv_tokens: int, min_group_kv_tokens: int) -> int:
    """The most micro-batch groups over a cache of `max_kv_tokens` tokens so that each
    still holds `min_group_kv_tokens` (a group's longest sequence); at least 1."""
    if max_kv_tokens < 1 or min_group_kv_tokens < 1:
        raise SurgeError("KV token counts must be >= 1")
    return max(1, max_kv_tokens // min_group_kv_tokens)


def pipeline_micro_batches(num_stages: int, limit: int | None = None) -> int:
    """§7 Eq. 12: a pipeline of `num_stages` stages keeps that many micro-batches in
    flight (one per stage), at most `limit` (`micro_batch_limit`; None: unbounded)."""
    if num_stages < 1:
        raise SurgeError("a pipeline has >= 1 stage")
    return max(1, num_stages if limit is None else min(num_stages, limit))


def micro_batch_budgets(
    total_pages: int, held: Sequence[int], budgets: Sequence[int], num_active: int
) -> tuple[int, ...]:
    """KV pages each group may hold, for `num_active` active groups: the first
    `num_active` of `max(len(held), num_active)` groups (`held`, `budgets`: the existing
    groups' pages in use and allowed now; new groups hold none). A group past
    `num_active` that holds pages keeps its budget until it has drained (its sequences
    still grow), then gets none. The active groups share the rest by water-filling: each
    gets max(held, x) with x such that the sum is the rest, so none is cut below what it
    holds and the spare pages go to the emptiest. The budgets sum to `total_pages` when
    the active groups can take it all."""
    if len(held) != len(budgets) or num_active < 1 or total_pages < 0:
        raise SurgeError("one budget per group, >= 1 active group")
    n = max(len(held), num_active)
    used = list(held) + [0] * (n - len(held))
    out = [0] * n
    for i in range(num_active, n):
        out[i] = budgets[i] if used[i] > 0 else 0
    rest = total_pages - sum(out)
    active = used[:num_active]
    # Water-fill: the largest level x with sum(max(h, x)) <= rest.
    lo, hi = 0, max(rest, 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(max(h, mid) for h in active) <= rest:
            lo = mid
        else:
            hi = mid - 1
    level = [max(h, lo) for h in active]
    spare = rest - sum(level)
    for i in range(num_active):  # pages the integer level leaves over, to the first groups
        if spare <= 0:
            break
        if level[i] == lo:
            level[i] += 1
            spare -= 1
    out[:num_active] = level
    return tuple(out)


def flexpipe_micro_batches(
    settings: FlexPipeSettings, num_stages: int, num_layers: int, max_kv_tokens: int
) -> tuple[int, int]:
    """A FlexPipe pipeline's (micro-batches in flight for `num_stages` stages, the most it
    may need at any granularity of `settings.stage_counts` a model of `num_layers` layers
    allows), both bounded by a cache of `max_kv_tokens` tokens split in groups of at least
    `settings.min_group_kv_tokens` (§7 Eq. 12, `micro_batch_limit`). The runtime's head
    sizes a sequence's share of its cache by the second; the simulator uses the first."""
    finest = min(max(settings.stage_counts), num_layers)
    limit = micro_batch_limit(max_kv_tokens, settings.min_group_kv_tokens)
    return pipeline_micro_batches(num_stages, limit), pipeline_micro_batches(finest, limit)
