"""Tensor frames: round trips, zstd, and every malformed body refused with a clear error."""

from __future__ import annotations

import io
import pickle
import struct

import orjson
import pytest
import torch

from drift.wire.errors import BadFrame, BadTensor, PayloadTooLarge
from drift.wire.frames import compress, decode_frame, decompress, encode_frame


def _frame(header: dict, data: bytes) -> bytes:
    raw = orjson.dumps(header)
    return struct.pack("<Q", len(raw)) + raw + data


META = {"__metadata__": {"drift": '{"a": 1}'}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_round_trip_keeps_values_and_params(dtype):
    t = (torch.randn(2, 3, 4) * 10).to(dtype)
    params, tensors = decode_frame(encode_frame({"x": [1, "y"]}, {"t": t}))
    assert params == {"x": [1, "y"]}
    assert tensors["t"].dtype == dtype and torch.equal(tensors["t"], t)


def test_zstd_round_trip_and_bomb_limit():
    body = encode_frame({}, {"t": torch.zeros(1000)})
    packed = compress(body)
    assert len(packed) < len(body)
    assert decompress(packed, max_bytes=len(body)) == body
    with pytest.raises(PayloadTooLarge):
        decompress(packed, max_bytes=len(body) - 1)
    with pytest.raises(BadFrame, match="zstd"):
        decompress(b"not zstd at all", max_bytes=100)


def test_not_safetensors():
    with pytest.raises(BadFrame, match="header length"):
        decode_frame(b'{"hidden_states": [[1.0]]}')
    with pytest.raises(BadFrame, match="shorter"):
        decode_frame(b"abc")


def test_pickle_and_torch_save_refused():
    with pytest.raises(BadFrame, match="pickle"):
        decode_frame(pickle.dumps({"hidden_states": [1.0]}))
    buf = io.BytesIO()
    torch.save({"hidden_states": torch.zeros(2)}, buf)
    with pytest.raises(BadFrame, match="torch.save"):
        decode_frame(buf.getvalue())


def test_header_lengths_that_start_like_a_pickle_still_decode():
    """A header of 640, 896, 1152 or 1408 bytes begins 0x80 0x02..0x05, as a pickle does."""
    met = set()
    for n in range(8, 1400, 4):
        frame = encode_frame({"a": 1}, {"x" * n: torch.zeros(1)})
        if frame[0] == 0x80 and 2 <= frame[1] <= 5:
            met.add(frame[1])
            assert decode_frame(frame)[0] == {"a": 1}
    assert met == {2, 3, 4, 5}


def test_shapes_that_do_not_match_data():
    header = {**META, "t": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 16]}}
    with pytest.raises(BadFrame, match="needs 4000000 bytes"):
        decode_frame(_frame(header, b"\0" * 16))
    header = {**META, "t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    with pytest.raises(BadFrame, match="outside"):
        decode_frame(_frame(header, b"\0" * 8))
    with pytest.raises(BadFrame, match="cover"):
        decode_frame(_frame(header, b"\0" * 32))


def test_unsupported_dtype_and_missing_metadata():
    header = {**META, "t": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}
    with pytest.raises(BadTensor, match="unsupported dtype 'F64'"):
        decode_frame(_frame(header, b"\0" * 16))
    header = {"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    with pytest.raises(BadFrame, match="__metadata__"):
        decode_frame(_frame(header, b"\0" * 8))


def test_body_limit():
    body = encode_frame({}, {"t": torch.zeros(100)})
    with pytest.raises(PayloadTooLarge):
        decode_frame(body, max_bytes=100)
