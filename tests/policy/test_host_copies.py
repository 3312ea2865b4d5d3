"""The host-copy rules `surge serve`'s controller carries out (`surge.policy.copies.host_copies`):
which node keeps a model's pinned copy, which copies expire, where a new copy is read, and
what a load's LRU copy may take while other copies are still arriving."""

from surge.policy.copies.host_copies import (
    NodeHostCache,
    PinnedCopy,
    copy_after_load,
    expired_copies,
    host_copy_source,
    pinned_copy,
)
from surge.policy.copies.keepalive import CacheDecision, CacheEntry, CacheSettings

GB = 1 << 30
SETTINGS = CacheSettings(capacity_bytes=4 * GB, keep_alive_s=10.0)


def _entry(model: str, gb: int, last_used_s: float = 0.0, pinned: bool = False) -> CacheEntry:
    return CacheEntry(model, gb * GB, last_used_s, pinned)


def test_an_existing_complete_copy_is_pinned_without_a_load() -> None:
    caches = [NodeHostCache(0, ()), NodeHostCache(1, (_entry("m", 1),)), NodeHostCache(2, ())]
    assert pinned_copy(caches, SETTINGS, complete_on=[2, 1]) == PinnedCopy(1, needs_load=False)


def test_a_copy_on_a_dead_node_does_not_count() -> None:
    caches = [NodeHostCache(0, (_entry("a", 3),)), NodeHostCache(1, ())]
    assert pinned_copy(caches, SETTINGS, complete_on=[5]) == PinnedCopy(1, needs_load=True)


def test_a_new_copy_goes_to_the_node_with_most_free_host_memory() -> None:
    caches = [
        NodeHostCache(0, (_entry("a", 3),)),
        NodeHostCache(1, (_entry("b", 1),)),
        NodeHostCache(2, (_entry("c", 2),)),
    ]
    assert pinned_copy(caches, SETTINGS, complete_on=[]) == PinnedCopy(1, needs_load=True)


def test_ties_go_to_the_lowest_node_and_no_live_node_gives_none() -> None:
    caches = [NodeHostCache(3, ()), NodeHostCache(1, ()), NodeHostCache(2, ())]
    assert pinned_copy(caches, SETTINGS, complete_on=[]) == PinnedCopy(1, needs_load=True)
    assert pinned_copy([], SETTINGS, complete_on=[0]) is None


def test_unused_unpinned_copies_expire_except_where_the_model_runs() -> None:
    caches = [
        NodeHostCache(1, (_entry("old", 1, 0.0), _entry("pinned", 1, 0.0, pinned=True))),
        NodeHostCache(0, (_entry("old", 1, 0.0), _entry("fresh", 1, 15.0))),
        NodeHostCache(2, (_entry("old", 1, 0.0),), busy_models=frozenset({"old"})),
    ]
    assert expired_copies(caches, now_s=20.0, settings=SETTINGS) == ((0, "old"), (1, "old"))
    never = CacheSettings(capacity_bytes=4 * GB, keep_alive_s=None)
    assert expired_copies(caches, now_s=1e9, settings=never) == ()


def test_a_new_host_copy_reads_the_local_disk_only_when_it_is_whole() -> None:
    assert host_copy_source(4, {0, 1, 2, 3}) == "disk"
    assert host_copy_source(4, {0, 1, 3}) == "remote"
    assert host_copy_source(4, set()) == "remote"


def test_copies_still_arriving_hold_their_room_and_are_never_victims() -> None:
    """Two ServerlessLLM loads starting at once onto one node: the first's copy is admitted
    and still arriving when the second asks; it must count, or both fit on paper and the
    cache ends one model over its capacity."""
    s = CacheSettings(capacity_bytes=14)
    held = (CacheEntry("c", 8, 1.0),)
    first = CacheEntry("a", 4, 5.0)
    second = CacheEntry("b", 6, 5.0)
    alone = copy_after_load("lru", held, second, s)
    assert alone == CacheDecision(True, ())  # 8 + 6 fits when nothing else arrives
    # with `a` arriving the cache holds 12: the least recently used `c` must go
    assert copy_after_load("lru", held, second, s, arriving=(first,)) == CacheDecision(True, ("c",))
    # an arriving copy is never a victim: with only it to evict, the load keeps no copy
    big = CacheEntry("big", 11, 6.0)
    assert copy_after_load("lru", (), big, s, arriving=(first,)) == CacheDecision(False, ())
    # the same model arriving already is only refreshed
    assert copy_after_load("lru", held, first, s, arriving=(first,)) == CacheDecision(True, ())
    assert copy_after_load("none", held, second, s, arriving=(first,)).admit is False
