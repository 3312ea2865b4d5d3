"""FlexPipe's memory-aware elastic scaling (§7): host copies kept after GPU eviction.

In: the deployment's system, the host cache's admission of the evicted blocks (`policy.copies.
keepalive.admit`, without evicting anyone), and later a node's host-tier blocks and a
stage's blocks. Out: whether a released slot's GPU blocks go to its host tier before they
are freed (`keep_host_after_eviction`), and where a new stage reads its blocks from
(`stage_sources`). Carried out by the controller (`control/copies.py` `release_slot`,
`control/flexpipe.py` refactoring loads) and the runtime (`runtime/scaleout/flexpipe.py`;
the agent's `evict` with `keep_host`).

FlexPipe §7: "the system maintains parameter copies in host memory even after GPU
eviction, creating a middle-tier cache that survives instance termination and prevents
costly reloads from persistent storage", and Eq. 13 places the next stages on the servers
that hosted the model most recently, whose "caches are likely still warm". A stage holds a
part of the model, so what survives on a node is that part: a later stage over the same
blocks loads them from the host tier, and only the blocks the node does not hold from its
own tier (a registry, a disk).
The simulator's FlexPipe keeps a host copy on every machine (`host_cache` `all`), which
this makes true of the nodes that served it.
"""

from collections.abc import Collection, Iterable

from surge.policy.systems import SystemConfig


def keep_host_after_eviction(system: SystemConfig, admitted: bool) -> bool:
    """A FlexPipe slot's GPU blocks stay in its host tier when freed, if the host cache
    admits them without evicting another model's copy (`admitted`)."""
    return system.group_sizing == "flexpipe" and admitted


def stage_sources(
    own_tier: str, host_blocks: Collection[int], stage_blocks: Iterable[int]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Where a stage on a node reads its blocks: (source, blocks) pairs, the blocks its host
    tier holds (kept after an eviction, §7) from `host`, the others from the node's own
    best complete tier; in block order within each, no empty pair."""
    blocks = list(stage_blocks)
    kept = tuple(b for b in blocks if b in host_blocks)
    rest = tuple(b for b in blocks if b not in host_blocks)
    if own_tier == "host":  # a complete host copy holds them all
        return (("host", tuple(blocks)),) if blocks else ()
    return tuple((src, part) for src, part in (("host", kept), (own_tier, rest)) if part)
