"""FlexPipe §5 partitioning (Eq. 2/3): the DP is optimal, memory-safe and block-aware."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.errors import SurgeError
from surge.policy.flexpipe.partition import (
    OperatorProfile,
    PartitionSettings,
    activation_scale,
    partition_cost,
    partition_model,
)

GBPS_8 = 8.0  # 1e9 bytes/s: a byte costs a nanosecond


def uniform_ops(num_blocks: int, ops_per_block: int) -> tuple[OperatorProfile, ...]:
    return tuple(
        OperatorProfile(compute_s=1e-3, param_bytes=1000, activation_bytes=0, block=b)
        for b in range(num_blocks)
        for _ in range(ops_per_block)
    )


def test_cost_by_hand() -> None:
    # Three ops, 1 ms each, 1 MB params, 2 MB activations; B = 1 GB/s, C = 3 ms.
    ops = tuple(OperatorProfile(1e-3, 1_000_000, 2_000_000, block=i // 2) for i in range(3))
    s = PartitionSettings(2, GBPS_8, 10**9, boundary_penalty_s=0.5, target_cycle_s=3e-3)
    # Stage [0,1): 1 ms + 1 ms params + 2 ms activation = 4 ms; it cuts block 0 in half.
    # Stage [1,3): 2 ms + 2 ms params, last stage so no activation = 4 ms.
    assert partition_cost(ops, ((0, 1), (1, 3)), s) == pytest.approx(1e-3 + 0.5 + 1e-3)


def test_eq3_scales_activations_with_log_batch() -> None:
    s = PartitionSettings(1, 1.0, 1, batch_size=8, profiling_batch_size=2, activation_growth=0.5)
    assert activation_scale(s) == pytest.approx(1 + 0.5 * math.log(4))


def test_balanced_cuts_on_a_uniform_model() -> None:
    ops = uniform_ops(8, 1)
    part = partition_model(ops, PartitionSettings(4, GBPS_8, 10**9))
    assert part.bounds == ((0, 2), (2, 4), (4, 6), (6, 8))
    assert max(part.stage_times_s) == pytest.approx(min(part.stage_times_s))


def test_regulariser_moves_cuts_to_block_boundaries() -> None:
    # 3 blocks of 2 ops: a balanced 2-stage cut would split block 1 in the middle.
    ops = uniform_ops(3, 2)
    free = partition_model(ops, PartitionSettings(2, GBPS_8, 10**9))
    assert free.bounds == ((0, 3), (3, 6))
    biased = partition_model(ops, PartitionSettings(2, GBPS_8, 10**9, boundary_penalty_s=1.0))
    cut = biased.bounds[0][1]
    assert ops[cut - 1].block != ops[cut].block


def test_memory_limit_is_respected_or_refused() -> None:
    ops = (
        OperatorProfile(5e-3, 900, 0, 0),
        OperatorProfile(1e-3, 100, 0, 1),
        OperatorProfile(1e-3, 100, 0, 2),
    )
    part = partition_model(ops, PartitionSettings(2, GBPS_8, 1000))
    assert all(sum(o.param_bytes for o in ops[a:b]) <= 1000 for a, b in part.bounds)
    with pytest.raises(SurgeError):
        partition_model(ops, PartitionSettings(2, GBPS_8, 800))
    with pytest.raises(SurgeError):
        partition_model(ops, PartitionSettings(4, GBPS_8, 1000))


OPS = st.lists(
    st.builds(
        OperatorProfile,
        compute_s=st.sampled_from([1e-3, 2e-3, 5e-3]),
        param_bytes=st.sampled_from([0, 1_000_000, 3_000_000]),
        activation_bytes=st.sampled_from([0, 500_000, 2_000_000]),
        block=st.integers(0, 1),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=120, deadline=None)
@given(
    raw=OPS,
    k=st.integers(1, 4),
    penalty=st.sampled_from([0.0, 1e-3, 0.1]),
    memory=st.sampled_from([3_000_000, 6_000_000, 10**9]),
    cycle=st.sampled_from([None, 2e-3]),
    batch=st.sampled_from([1, 4]),
)
def test_dp_equals_brute_force(
    raw: list[OperatorProfile],
    k: int,
    penalty: float,
    memory: int,
    cycle: float | None,
    batch: int,
) -> None:
    # `block` draws 0 (same block as the previous operator) or 1 (a new block starts).
    blocks = list(itertools.accumulate(o.block for o in raw))
    ops = tuple(
        OperatorProfile(o.compute_s, o.param_bytes, o.activation_bytes, b)
        for o, b in zip(raw, blocks, strict=True)
    )
    s = PartitionSettings(k, GBPS_8, memory, penalty, cycle, batch, 1, activation_growth=0.3)
    n = len(ops)
    best = math.inf
    if k <= n:
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = (0, *cuts, n)
            best = min(best, partition_cost(ops, tuple(itertools.pairwise(edges)), s))
    if best == math.inf:
        with pytest.raises(SurgeError):
            partition_model(ops, s)
        return
    part = partition_model(ops, s)
    assert part.cost == pytest.approx(best)
    assert partition_cost(ops, part.bounds, s) == pytest.approx(best)
    assert len(part.bounds) == k and part.bounds[0][0] == 0 and part.bounds[-1][1] == n
    assert all(a < b for a, b in part.bounds)
