"""`block_states`: a request's flag asks a span for each block's output; the reply carries
them as one named tensor [B, T, n_blocks, H], checked against what was asked."""

from __future__ import annotations

import pytest
import torch

from drift import PROTOCOL_VERSION
from drift.wire import messages as m
from drift.wire.checks import StepLimits
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.extras import BLOCK_STATES
from drift.wire.frames import decode_frame, encode_frame

H = 8


def test_flag_round_trips_and_is_absent_unless_asked():
    hidden = torch.randn(2, 3, H)
    fwd = m.decode(m.ForwardRequest, m.encode(m.ForwardRequest("fp", 0, 2, hidden,
                                                               block_states=True)))  # fmt: skip
    assert fwd.block_states is True
    step = m.decode(m.StepRequest, m.encode(m.StepRequest(1, 0, hidden, block_states=True)),
                    limits=StepLimits(H, 2, 16, 2))  # fmt: skip
    assert step.block_states is True
    params, _ = decode_frame(m.encode(m.StepRequest(1, 0, hidden, block_states=True)))
    assert params[BLOCK_STATES] is True
    assert m.encode(m.StepRequest(4, 9, hidden)) == encode_frame(
        {"type": "step", "version": PROTOCOL_VERSION, "step_id": 4, "position": 9},
        {"hidden_states": hidden},
    )
    assert m.decode(m.StepRequest, m.encode(m.StepRequest(4, 9, hidden))).block_states is False


def test_replies_carry_exactly_the_states_asked_for():
    hidden = torch.randn(2, 3, H)
    states = {BLOCK_STATES: torch.randn(2, 3, 4, H)}
    reply = m.decode(m.ForwardResponse, m.encode(m.ForwardResponse(hidden, states)), states=4)
    assert torch.equal(reply.extras[BLOCK_STATES], states[BLOCK_STATES])
    step = m.decode(m.StepResponse, m.encode(m.StepResponse(1, hidden, states)), states=4)
    assert torch.equal(step.extras[BLOCK_STATES], states[BLOCK_STATES])
    with pytest.raises(BadTensor, match=r"missing tensors \['block_states'\]"):
        m.decode(m.StepResponse, m.encode(m.StepResponse(1, hidden)), states=4)
    with pytest.raises(BadTensor, match=r"block_states has shape \[2, 3, 4, 8\]"):
        m.decode(m.ForwardResponse, m.encode(m.ForwardResponse(hidden, states)), states=3)
    with pytest.raises(BadTensor, match=r"unexpected tensors \['block_states'\]"):
        m.decode(m.ForwardResponse, m.encode(m.ForwardResponse(hidden, states)))
    as_json = m.ForwardResponse(hidden, states).to_json()
    assert torch.tensor(as_json[BLOCK_STATES]).shape == (2, 3, 4, H)


def test_flag_must_be_a_boolean():
    hidden = torch.randn(1, 2, H)
    params, tensors = decode_frame(m.encode(m.StepRequest(1, 0, hidden)))
    with pytest.raises(BadRequest, match="'block_states' must be true or false"):
        m.StepRequest.from_wire({**params, BLOCK_STATES: 1}, tensors)
    params, tensors = decode_frame(m.encode(m.ForwardRequest("fp", 0, 2, hidden)))
    with pytest.raises(BadRequest, match="'block_states' must be true or false"):
        m.ForwardRequest.from_wire({**params, BLOCK_STATES: "yes"}, tensors)
