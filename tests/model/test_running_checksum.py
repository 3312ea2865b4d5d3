"""A block's checksum taken while it arrives (`RunningChecksum`) and verified at the end."""

import os
import zlib

import pytest

from surge.errors import SurgeError
from surge.model.manifest import BlockInfo, RunningChecksum, block_checksum, verify_block


def block_of(data: bytes) -> BlockInfo:
    return BlockInfo(
        index=3,
        file="block_00003.bin",
        first_layer=0,
        end_layer=1,
        has_embed=False,
        has_head=False,
        size_bytes=len(data),
        checksum=block_checksum(data),
    )


def feed(running: RunningChecksum, buf: bytearray, sizes: list[int]) -> None:
    """Land `buf` read by read, as the receive path does."""
    offset = 0
    for n in sizes:
        running.update(memoryview(buf)[offset : offset + n], offset)
        offset += n


def test_small_reads_are_summed_as_they_land_and_match_the_whole_buffer() -> None:
    data = bytearray(os.urandom(300_000))
    running = RunningChecksum(max_inline_bytes=64 << 10)
    feed(running, data, [10_000, 65_536, 1, 60_000, 64_000, 64_000, 36_463])
    # Every read was small: nothing is left to sum after the last one.
    assert running.num_bytes == len(data)
    assert running.value == zlib.crc32(data)
    verify_block(block_of(bytes(data)), data, running)


def test_a_large_read_leaves_the_rest_to_finish_which_is_still_exact() -> None:
    data = bytearray(os.urandom(300_000))
    running = RunningChecksum(max_inline_bytes=64 << 10)
    feed(running, data, [50_000, 200_000, 50_000])  # the 200 KB read is summed at the end
    assert running.num_bytes == 50_000
    assert running.finish(data) == block_checksum(data)
    verify_block(block_of(bytes(data)), data, running)


def test_a_byte_damaged_in_an_inline_read_is_refused() -> None:
    good = os.urandom(100_000)
    data = bytearray(good)
    data[70_000] ^= 0xFF
    running = RunningChecksum()
    feed(running, data, [40_000, 40_000, 20_000])
    assert running.num_bytes == len(data)
    with pytest.raises(SurgeError, match=r"block 3 .* failed its checksum"):
        verify_block(block_of(good), data, running)


def test_an_out_of_order_read_stops_the_running_sum_rather_than_mixing_orders() -> None:
    data = bytearray(os.urandom(10_000))
    running = RunningChecksum()
    running.update(memoryview(data)[5_000:], 5_000)  # out of order: not summed
    assert running.num_bytes == 0
    assert running.finish(data) == block_checksum(data)
