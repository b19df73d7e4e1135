"""The hand-written frame codec stays byte-compatible with safetensors, both ways."""

from __future__ import annotations

import struct

import orjson
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from drift.wire.errors import BadFrame
from drift.wire.frames import decode_frame, encode_frame


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(1, 2, 5, generator=g),
        "f16": torch.randn(3, generator=g).half(),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "i64": torch.arange(3),
        "i32": torch.arange(4, dtype=torch.int32),
        "u8": torch.tensor([1, 255], dtype=torch.uint8),
        "mask": torch.tensor([[True, False, True]]),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(3.5),
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


def test_safetensors_reads_our_frames():
    ts = _tensors()
    body = encode_frame({"step_id": 7}, ts)
    _same(st_load(body), ts)
    params, back = decode_frame(body)
    assert params == {"step_id": 7}
    _same(back, ts)


def test_we_read_safetensors_frames():
    ts = _tensors()
    meta = {"drift": orjson.dumps({"a": [1, 2]}).decode()}
    params, back = decode_frame(st_save({k: v.contiguous() for k, v in ts.items()}, metadata=meta))
    assert params == {"a": [1, 2]}
    _same(back, ts)
    back["f32"] += 1  # decoded tensors are writable, independent of the body
    assert not torch.equal(back["f32"], ts["f32"])


def test_misaligned_tensor_and_truncated_data():
    header = {"__metadata__": {"drift": "{}"},
              "u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "x": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}}  # fmt: skip
    head = orjson.dumps(header)
    data = b"\x05" + torch.tensor([1.5, -2.0]).numpy().tobytes()
    params, back = decode_frame(struct.pack("<Q", len(head)) + head + data)
    assert back["u"].tolist() == [5] and back["x"].tolist() == [1.5, -2.0]
    with pytest.raises(BadFrame):
        decode_frame(struct.pack("<Q", len(head)) + head + data[:-1])
