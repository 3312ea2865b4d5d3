"""Sub-groups of a k -> N scale-out and λScale's k-way block order.

In: N nodes of which nodes 0..K-1 are sources, and B blocks.
Out: `split_subgroups` -> K node lists (source first, then its destinations), and
`kway_block_orders` -> the order in which each sub-group multicasts the blocks.
"""

from surge.errors import SurgeError


def check_sizes(num_nodes: int, num_blocks: int, num_sources: int) -> None:
    """Raise `SurgeError` unless N >= 2, B >= 1 and 1 <= K < N."""
    if num_nodes < 2:
        raise SurgeError(f"--nodes must be at least 2 (got {num_nodes})")
    if num_blocks < 1:
        raise SurgeError(f"--blocks must be at least 1 (got {num_blocks})")
    if not 1 <= num_sources < num_nodes:
        raise SurgeError(
            f"--sources must be between 1 and nodes-1 = {num_nodes - 1} (got {num_sources})"
        )


def split_subgroups(num_nodes: int, num_sources: int) -> list[list[int]]:
    """Split N nodes into K sub-groups; sub-group i is [source i, its destinations...].

    λScale §4.2: the N nodes are divided evenly into K sub-groups. Destinations K..N-1
    are dealt out in contiguous runs whose sizes differ by at most one (the first
    (N-K) mod K sub-groups get the extra node), so for the paper's 2 -> 8 example the
    sub-groups are [0, 2, 3, 4] and [1, 5, 6, 7].
    """
    num_dests = num_nodes - num_sources
    base, extra = divmod(num_dests, num_sources)
    groups: list[list[int]] = []
    next_dest = num_sources
    for source in range(num_sources):
        size = base + (1 if source < extra else 0)
        groups.append([source, *range(next_dest, next_dest + size)])
        next_dest += size
    return groups


def kway_block_orders(num_blocks: int, num_sources: int) -> list[list[int]]:
    """Block order of each of the K sub-groups.  # λScale §4.2, Alg. 1

    Blocks are partitioned into K chunks of l = ceil(B/K) consecutive blocks (the last
    chunks may be short or empty); sub-group i sends the chunks circularly shifted by i:
    S_i, S_{i+1}, ..., S_{i-1}. With K = 1 this is plain layer order.
    """
    chunk = -(-num_blocks // num_sources)
    chunks = [list(range(chunk * i, min(chunk * (i + 1), num_blocks))) for i in range(num_sources)]
    return [
        [block for j in range(num_sources) for block in chunks[(i + j) % num_sources]]
        for i in range(num_sources)
    ]
