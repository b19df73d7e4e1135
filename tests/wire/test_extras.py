"""Named extras beside hidden_states (Gemma 4): they round-trip, are checked once against the
span's ExtraSpec, and frames without them are byte for byte what they were before."""

from __future__ import annotations

import pytest
import torch

from drift import PROTOCOL_VERSION
from drift.wire import messages as m
from drift.wire.checks import StepLimits
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.extras import ExtraSpec, kv_names
from drift.wire.frames import decode_frame, encode_frame

H = 8
# a span of 2 blocks with per-layer inputs of 4, reading donor 2's K/V, able to donate 3's
SPEC = ExtraSpec(
    inputs=(
        ("per_layer_inputs", ("B", "T", 2, 4)),
        ("kv.2.k", ("B", 1, "T", 16)),
        ("kv.2.v", ("B", 1, "T", 16)),
    ),
    donors=((3, ("B", 2, "T", 8)),),
)


def _spec(start: int, end: int) -> ExtraSpec:
    return SPEC


def _extras(b: int = 2, t: int = 3) -> dict[str, torch.Tensor]:
    return {
        "per_layer_inputs": torch.randn(b, t, 2, 4),
        "kv.2.k": torch.randn(b, 1, t, 16),
        "kv.2.v": torch.randn(b, 1, t, 16),
    }


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_frames_without_extras_are_unchanged():
    hidden = torch.randn(2, 3, H)
    assert m.encode(m.StepRequest(4, 9, hidden)) == encode_frame(
        {"type": "step", "version": PROTOCOL_VERSION, "step_id": 4, "position": 9},
        {"hidden_states": hidden},
    )
    assert m.encode(m.ForwardRequest("fp", 0, 2, hidden)) == encode_frame(
        {"type": "forward", "version": PROTOCOL_VERSION, "model": "fp", "start_block": 0,
         "end_block": 2},
        {"hidden_states": hidden},
    )  # fmt: skip
    assert m.encode(m.StepResponse(4, hidden)) == encode_frame(
        {"type": "step_result", "version": PROTOCOL_VERSION, "step_id": 4},
        {"hidden_states": hidden},
    )


def test_extras_and_donate_round_trip():
    hidden, extras = torch.randn(2, 3, H), _extras()
    step = m.StepRequest(1, 0, hidden, extras=extras, donate=(3,))
    limits = StepLimits(H, 2, 16, 2, extras=SPEC)
    back = m.decode(m.StepRequest, m.encode(step), limits=limits)
    assert back.donate == (3,) and _equal(back.extras, extras)
    fwd = m.decode(m.ForwardRequest, m.encode(m.ForwardRequest("fp", 4, 6, hidden, extras=extras,
                                                               donate=(3,))), extras=_spec)  # fmt: skip
    assert fwd.donate == (3,) and _equal(fwd.extras, extras)
    donated = {n: torch.randn(2, 2, 3, 8) for n in kv_names(3)}
    reply = m.decode(m.StepResponse, m.encode(m.StepResponse(1, hidden, donated)), donate=(3,))
    assert _equal(reply.extras, donated)
    grads = {"kv.3.k": torch.randn(2, 2, 3, 8)}
    bwd = m.BackwardRequest("fp", 4, 6, hidden, hidden, extras=extras, grad_extras=grads)
    back_bwd = m.decode(m.BackwardRequest, m.encode(bwd), extras=_spec)
    assert _equal(back_bwd.grad_extras, grads) and _equal(back_bwd.extras, extras)
    answer = m.BackwardResponse(hidden, None, {k: v * 2 for k, v in extras.items()})
    got = m.decode(m.BackwardResponse, m.encode(answer), extras=tuple(extras))
    assert _equal(got.grad_extras, answer.grad_extras)


def test_bad_extras_are_refused_by_name():
    hidden = torch.randn(2, 3, H)
    limits = StepLimits(H, 2, 16, 2, extras=SPEC)

    def step(extras, **params):
        frame = m.encode(m.StepRequest(1, 0, hidden, extras=extras))
        params_, tensors = decode_frame(frame)
        return m.StepRequest.from_wire({**params_, **params}, tensors, limits=limits)

    missing = _extras()
    del missing["kv.2.v"]
    with pytest.raises(BadTensor, match=r"missing tensors \['kv.2.v'\]"):
        step(missing)
    with pytest.raises(BadTensor, match=r"unexpected tensors \['kv.9.k'\]"):
        step({**_extras(), "kv.9.k": torch.randn(2, 1, 3, 16)})
    with pytest.raises(BadTensor, match=r"per_layer_inputs has shape \[2, 3, 3, 4\]"):
        step({**_extras(), "per_layer_inputs": torch.randn(2, 3, 3, 4)})
    with pytest.raises(BadTensor, match=r"kv.2.k has shape \[2, 1, 2, 16\]"):
        step({**_extras(), "kv.2.k": torch.randn(2, 1, 2, 16)})  # tokens must match hidden's
    with pytest.raises(BadTensor, match="dtype"):
        step({**_extras(), "kv.2.k": torch.ones(2, 1, 3, 16, dtype=torch.int64)})
    with pytest.raises(BadRequest, match=r"cannot donate .* blocks \[2\].*\[3\]"):
        step(_extras(), donate=[2])
    with pytest.raises(BadRequest, match="list of block indices"):
        step(_extras(), donate="3")
    with pytest.raises(BadTensor, match=r"unexpected tensors \['grad.kv.2.k'\]"):
        bwd = m.BackwardRequest("fp", 4, 6, hidden, hidden, extras=_extras(),
                                grad_extras={"kv.2.k": torch.randn(2, 1, 3, 16)})  # fmt: skip
        m.decode(m.BackwardRequest, m.encode(bwd), extras=_spec)
    # a server of another family takes none: the same tensors are unexpected there
    with pytest.raises(BadTensor, match="unexpected tensors"):
        m.decode(m.ForwardRequest, m.encode(m.ForwardRequest("fp", 0, 2, hidden, extras=_extras())))
    # a reply must carry exactly what was asked back
    with pytest.raises(BadTensor, match=r"missing tensors \['kv.3.k', 'kv.3.v'\]"):
        m.decode(m.StepResponse, m.encode(m.StepResponse(1, hidden)), donate=(3,))
