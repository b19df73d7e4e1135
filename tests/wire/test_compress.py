"""Activation compression on the wire (drift.wire.compress): round trips within each form's
error, frames that lie about their packing are refused, unpacked frames are untouched."""

from __future__ import annotations

import pytest
import torch

from drift.wire.compress import ABSMAX, BLOCK, WIRE_DTYPE, dequantize, pack, quantize, unpack
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.frames import decode_frame, encode_frame


def _round_trip(x: torch.Tensor, form: str | None) -> tuple[torch.Tensor, int]:
    params: dict = {"type": "step"}
    body = encode_frame(params, pack(params, {"hidden_states": x}, form))
    got_params, tensors = decode_frame(body)
    return unpack(got_params, tensors, torch.float32)["hidden_states"], len(body)


@pytest.mark.parametrize(("form", "rel"), [(None, 0.0), ("float16", 1e-3), ("bfloat16", 8e-3),
                                           ("int8", 1 / 127)])  # fmt: skip
def test_round_trip_error_and_size(form, rel):
    x = torch.randn(2, 3, 200, generator=torch.Generator().manual_seed(0)) * 5
    x[0, 0, 0] = 0.0
    y, size = _round_trip(x, form)
    assert y.dtype == torch.float32 and y.shape == x.shape
    if form == "int8":  # each value within half a step of its block's absmax / 127
        blocks = torch.nn.functional.pad(x.reshape(-1), (0, -x.numel() % BLOCK)).reshape(-1, BLOCK)
        step = (blocks.abs().amax(1) / 127).repeat_interleave(BLOCK)[: x.numel()]
        assert ((y - x).abs().reshape(-1) <= step / 2 + 1e-6).all()
    else:
        assert ((y - x).abs() <= rel * x.abs() + 1e-6).all()
    plain = _round_trip(x, None)[1]
    assert size <= {None: plain, "float16": plain // 2 + 200, "bfloat16": plain // 2 + 200,
                    "int8": plain // 2}[form]  # fmt: skip


def test_zero_block_and_other_tensors():
    x = torch.zeros(1, 1, 64)
    codes, absmax = quantize(x)
    assert torch.equal(dequantize("h", codes, absmax, torch.float32), x)
    params: dict = {}
    mask = torch.ones(1, 1, dtype=torch.int64)
    out = pack(params, {"hidden_states": x, "attention_mask": mask}, "float16")
    assert out["attention_mask"] is mask and params[WIRE_DTYPE] == "float16"


def test_lying_frames_are_refused():
    x = torch.randn(1, 2, 64)
    with pytest.raises(BadRequest, match="int4"):
        unpack({WIRE_DTYPE: "int4"}, {"hidden_states": x}, torch.float32)
    with pytest.raises(BadTensor, match="float16"):
        unpack({WIRE_DTYPE: "float16"}, {"hidden_states": x}, torch.float32)
    codes, absmax = quantize(x)
    with pytest.raises(BadTensor, match="absmax"):
        unpack({WIRE_DTYPE: "int8"}, {"hidden_states": codes}, torch.float32)
    with pytest.raises(BadTensor, match="shape"):
        unpack({WIRE_DTYPE: "int8"}, {"hidden_states": codes, "hidden_states" + ABSMAX: absmax[:1]},
               torch.float32)  # fmt: skip
    with pytest.raises(BadTensor, match="non-finite"):
        bad = torch.full_like(absmax, float("inf"))
        unpack({WIRE_DTYPE: "int8"}, {"hidden_states": codes, "hidden_states" + ABSMAX: bad},
               torch.float32)  # fmt: skip
    with pytest.raises(BadTensor, match="uint8"):
        unpack({WIRE_DTYPE: "int8"}, {"hidden_states": x, "hidden_states" + ABSMAX: absmax},
               torch.float32)  # fmt: skip
