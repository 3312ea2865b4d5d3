"""Host-tier eviction while a view of the block is still alive (the runner's tensors, a
send in flight, a slice the collector has not freed yet): evict must not raise (in CI an
`evict` op once failed with "cannot close: exported pointers exist"); the name goes at
once and the mapping closes when the last view is gone."""

import uuid
from multiprocessing import shared_memory

import pytest

from surge.model.manifest import BlockInfo
from surge.runtime.node.tiers import HostCache, segment_name


def _info(index: int) -> BlockInfo:
    return BlockInfo(
        index=index,
        file=f"block-{index}.bin",
        first_layer=index,
        end_layer=index + 1,
        has_embed=False,
        has_head=False,
        size_bytes=4096,
        checksum="crc32:00000000",
    )


def test_evicting_a_viewed_block_unlinks_it_and_closes_it_later() -> None:
    cache = HostCache(uuid.uuid4().hex[:8], 0)
    try:
        view = cache.allocate("m", _info(0))
        view[:4] = b"abcd"
        cache.allocate("m", _info(1))
        cache.evict("m", 0)  # a view is alive: no BufferError
        assert cache.blocks("m") == [1] and cache.get("m", 0) is None
        with pytest.raises(FileNotFoundError):  # its name is gone already
            shared_memory.SharedMemory(name=segment_name(cache.cluster_id, 0, "m", 0))
        assert bytes(view[:4]) == b"abcd"  # the viewer still reads valid memory
        assert len(cache._closing) == 1
        view.release()
        cache.evict("m", 1)  # the next eviction closes the one no longer viewed
        assert not cache._closing and not cache.blocks("m")
    finally:
        cache.close()
