"""Frames (JSON header + raw bytes) and hidden states serialized through them."""

import io

import pytest
import torch

from surge.engine.batch import BatchMeta
from surge.engine.hidden import hidden_from_bytes, hidden_to_bytes
from surge.wire import FrameError, decode_frame, encode_frame, read_frame


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hidden_states_round_trip_exactly(dtype: torch.dtype) -> None:
    hidden = torch.randn(3, 5, 16).to(dtype)
    batch = BatchMeta(seq_ids=(4, 9, 2), ctx_lens=(0, 7, 3), q_lens=(5, 1, 2))
    data = hidden_to_bytes(hidden, batch, stage=1)
    back, back_batch, header = hidden_from_bytes(bytearray(data))
    assert back.dtype == dtype and torch.equal(back, hidden)
    assert back_batch == batch and header["stage"] == 1
    # The payload is the raw tensor bytes: no pickle, no base64.
    assert len(data) - len(decode_frame(data)[1]) < 300
    assert b"pickle" not in data[:300]


def test_frames_stream_and_reject_garbage() -> None:
    stream = io.BytesIO(encode_frame({"op": "a"}, b"xyz") + encode_frame({"op": "b"}))
    assert read_frame(stream) == ({"op": "a", "length": 3}, bytearray(b"xyz"))
    assert read_frame(stream) == ({"op": "b", "length": 0}, bytearray())
    assert read_frame(stream) is None
    for bad in (
        b"\x00\x00",
        b"\x00\x00\x00\x05{bad}",
        b"\x7f\xff\xff\xff{}",
        encode_frame({"op": "a"}, b"xyz")[:-1],
        b"\x00\x00\x00\x02[]",
    ):
        with pytest.raises(FrameError):
            decode_frame(bad)
    with pytest.raises(FrameError, match="inside a frame payload"):
        read_frame(io.BytesIO(encode_frame({"op": "a"}, b"xyz")[:-1]))


def test_batch_meta_validates() -> None:
    with pytest.raises(ValueError):
        BatchMeta((1, 1), (0, 0), (1, 1))
    with pytest.raises(ValueError):
        BatchMeta((1,), (0,), (0,))
    with pytest.raises(ValueError):
        BatchMeta((1, 2), (0,), (1, 1))
