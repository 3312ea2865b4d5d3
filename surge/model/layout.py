"""Cutting a model's layers into blocks: contiguous layer ranges balanced by bytes.

Input: the bytes of each layer (the first layer carries the embeddings, the last the final
norm and lm_head) and a block count; output: the layer range of each block. Used by the
importer; pure and deterministic.
"""

from surge.errors import SurgeError

DEFAULT_MAX_BLOCKS = 8
"""Default block count cap: enough blocks to pipeline a multicast (λScale Fig. 18 finds the
elbow at a handful of blocks for small clusters) without paying per-transfer overhead on many
tiny blocks."""


def default_num_blocks(num_layers: int) -> int:
    """The block count used when the user gives none."""
    return max(1, min(num_layers, DEFAULT_MAX_BLOCKS))


def validate_num_blocks(num_blocks: int, num_layers: int) -> None:
    """Raise a clear error unless 1 <= num_blocks <= num_layers."""
    if not 1 <= num_blocks <= num_layers:
        raise SurgeError(
            f"--blocks {num_blocks} is out of range: this model has {num_layers} layers, so "
            f"choose 1 <= blocks <= {num_layers}"
        )


def partition_layers(layer_bytes: list[int], num_blocks: int) -> list[tuple[int, int]]:
    """Split layers into `num_blocks` contiguous ranges [start, end) minimising the largest
    block's bytes (the linear-partition problem, solved exactly by dynamic programming).

    Ties are broken towards earlier cuts, so the result is deterministic.
    """
    n = len(layer_bytes)
    validate_num_blocks(num_blocks, n)
    prefix = [0]
    for b in layer_bytes:
        prefix.append(prefix[-1] + b)
    inf = float("inf")
    # cost[k][i]: smallest max-block-bytes splitting the first i layers into k blocks.
    cost = [[inf] * (n + 1) for _ in range(num_blocks + 1)]
    cut = [[0] * (n + 1) for _ in range(num_blocks + 1)]
    cost[0][0] = 0
    for k in range(1, num_blocks + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                c = max(cost[k - 1][j], prefix[i] - prefix[j])
                if c < cost[k][i]:
                    cost[k][i] = c
                    cut[k][i] = j
    ranges: list[tuple[int, int]] = []
    end = n
    for k in range(num_blocks, 0, -1):
        start = cut[k][end]
        ranges.append((start, end))
        end = start
    ranges.reverse()
    assert ranges[0][0] == 0 and ranges[-1][1] == n and all(s < e for s, e in ranges)
    return ranges
