"""Typed messages: every message round-trips; each bad form is refused with its own error."""

from __future__ import annotations

import pytest
import torch

from drift import PROTOCOL_VERSION
from drift.wire import messages as m
from drift.wire.errors import BadRequest, BadTensor, VersionMismatch
from drift.wire.frames import encode_frame

H = 8


def _hidden(b=2, t=3, dtype=torch.float32):
    return torch.randn(b, t, H).to(dtype)


def _same(a, b):
    for field in a.__dataclass_fields__:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), field
        else:
            assert x == y, field


@pytest.mark.parametrize(
    "msg",
    [
        m.ForwardRequest("fp", 1, 3, _hidden()),
        m.ForwardRequest(
            "fp",
            0,
            2,
            _hidden(dtype=torch.bfloat16),
            attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
            prompts=torch.randn(2, 2, 1, H).bfloat16(),
        ),  # fmt: skip
        m.BackwardRequest("fp", 0, 1, _hidden(), _hidden(), prompts=torch.randn(1, 2, 2, H)),
        m.ForwardRequest("fp", 1, 3, _hidden(), adapter="chat"),  # a served LoRA adapter
        m.BackwardRequest("fp", 0, 1, _hidden(), _hidden(), adapter="chat"),
        m.StepRequest(7, 5, _hidden(t=1, dtype=torch.float16), hypo_ids=torch.tensor([1, 0])),
        m.StepRequest(
            0,
            0,
            _hidden(),
            attention_mask=torch.ones(2, 3, dtype=torch.int64),
            prompts=torch.randn(4, 2, 2, H),
        ),  # fmt: skip
    ],
)
def test_request_round_trip(msg):
    back = m.decode(type(msg), m.encode(msg), hidden_size=H)
    _same(msg, back)


@pytest.mark.parametrize(
    "msg",
    [
        m.ForwardResponse(_hidden()),
        m.BackwardResponse(_hidden(), torch.randn(2, 2, 1, H)),
        m.BackwardResponse(_hidden()),
        m.StepResponse(3, _hidden(t=1)),
    ],
)
def test_response_round_trip(msg):
    _same(msg, m.decode(type(msg), m.encode(msg)))


@pytest.mark.parametrize(
    "msg",
    [
        m.OpenSession("fp", 0, 4, 128, 2, "bfloat16"),
        m.OpenSession("fp", 0, 4, 128, 2, "float32", adapter="chat"),
        m.OpenSession(
            "fp", 0, 4, 128, 2, "float32", session_id="0123456789abcdef", push_token="f" * 32
        ),  # fmt: skip
        m.SessionOpened("abc", 128),
        m.SessionOpened("abc", 128, "t" * 32, holds=5, idles=True),
        m.CloseSession(),
        m.IdleSession(),
        m.ErrorMessage("cache_full", "no room", step_id=3),
        m.ErrorMessage("bad_frame", "bad"),
    ],
)
def test_json_round_trip(msg):
    assert type(msg).from_wire(msg.to_wire()) == msg


def _fwd_params(**over):
    return {"type": "forward", "version": PROTOCOL_VERSION, "model": "fp",
            "start_block": 0, "end_block": 2, **over}  # fmt: skip


def test_forward_bad_forms():
    ok = {"hidden_states": _hidden()}
    with pytest.raises(BadTensor, match="hidden size 8, this model's is 16"):
        m.ForwardRequest.from_wire(_fwd_params(), ok, hidden_size=16)
    with pytest.raises(BadTensor, match="rank 3"):
        m.ForwardRequest.from_wire(_fwd_params(), {"hidden_states": torch.randn(3, H)})
    with pytest.raises(BadTensor, match="activations travel"):
        m.ForwardRequest.from_wire(_fwd_params(), {"hidden_states": torch.ones(2, 3, H).long()})
    with pytest.raises(BadTensor, match="missing tensor"):
        m.ForwardRequest.from_wire(_fwd_params(), {})
    with pytest.raises(BadTensor, match="unexpected"):
        m.ForwardRequest.from_wire(_fwd_params(), {**ok, "junk": torch.zeros(1)})
    with pytest.raises(BadTensor, match="empty dimension"):
        m.ForwardRequest.from_wire(_fwd_params(), {"hidden_states": torch.zeros(2, 0, H)})
    with pytest.raises(BadRequest, match="empty span"):
        m.ForwardRequest.from_wire(_fwd_params(start_block=2), ok)
    with pytest.raises(BadRequest, match="must be an integer"):
        m.ForwardRequest.from_wire(_fwd_params(start_block="0"), ok)
    with pytest.raises(BadRequest, match="out of range"):
        m.ForwardRequest.from_wire(_fwd_params(start_block=-1), ok)
    with pytest.raises(BadRequest, match="model"):
        m.ForwardRequest.from_wire(_fwd_params(model=None), ok)
    with pytest.raises(BadTensor, match="prompts cover 1 blocks"):
        m.ForwardRequest.from_wire(_fwd_params(), {**ok, "prompts": torch.randn(1, 2, 1, H)})
    with pytest.raises(BadTensor, match="attention_mask has shape"):
        m.ForwardRequest.from_wire(_fwd_params(), {**ok, "attention_mask": torch.ones(2, 2).long()})
    with pytest.raises(BadTensor, match="only 0 and 1"):
        bad = torch.full((2, 3), 2)
        m.ForwardRequest.from_wire(_fwd_params(), {**ok, "attention_mask": bad})


def test_version_checks():
    ok = {"hidden_states": _hidden()}
    with pytest.raises(VersionMismatch, match="2.0"):
        m.ForwardRequest.from_wire(_fwd_params(version="2.0"), ok)
    params = _fwd_params()
    del params["version"]
    with pytest.raises(BadRequest, match="version"):
        m.ForwardRequest.from_wire(params, ok)
    assert m.ForwardRequest.from_wire(_fwd_params(version="1.7"), ok).end_block == 2


def test_backward_bad_grad():
    params = _fwd_params(type="backward")
    with pytest.raises(BadTensor, match="grad_outputs has shape"):
        m.BackwardRequest.from_wire(params, {"hidden_states": _hidden(),
                                             "grad_outputs": _hidden(t=2)})  # fmt: skip
    with pytest.raises(BadTensor, match="missing tensor 'grad_outputs'"):
        m.BackwardRequest.from_wire(params, {"hidden_states": _hidden()})


def test_step_bad_forms():
    params = {"type": "step", "version": PROTOCOL_VERSION, "step_id": 1, "position": 0}
    ok = {"hidden_states": _hidden()}
    with pytest.raises(BadTensor, match=r"values must lie in \[0, 2\)"):
        m.StepRequest.from_wire(params, {**ok, "hypo_ids": torch.tensor([0, 2])})
    with pytest.raises(BadTensor, match="int64 or int32"):
        m.StepRequest.from_wire(params, {**ok, "hypo_ids": torch.tensor([0.0, 1.0])})
    with pytest.raises(BadRequest, match="'step' frame"):
        m.StepRequest.from_wire({**params, "type": "forward"}, ok)
    with pytest.raises(BadRequest, match="position"):
        m.StepRequest.from_wire({**params, "position": -3}, ok)


def test_open_bad_forms():
    good = m.OpenSession("fp", 0, 4, 128, 2, "float32").to_wire()
    with pytest.raises(BadRequest, match="dtype 'float64'"):
        m.OpenSession.from_wire({**good, "dtype": "float64"})
    with pytest.raises(BadRequest, match="batch_size"):
        m.OpenSession.from_wire({**good, "batch_size": 0})
    with pytest.raises(BadRequest, match="type 'open'"):
        m.OpenSession.from_wire({**good, "type": "step"})
    with pytest.raises(BadRequest, match="type 'open', got 'list'"):
        m.OpenSession.from_wire([1, 2])
    # a client's own session id and push token: exactly 16 and 32 lowercase hex digits
    session_id, push_token = m.new_session_ids()
    chosen = m.OpenSession.from_wire({**good, "session_id": session_id, "push_token": push_token})
    assert (chosen.session_id, chosen.push_token) == (session_id, push_token)
    assert push_token not in repr(chosen)  # a secret: never logged
    for name, bad in (("session_id", "abc"), ("session_id", "0123456789ABCDEF"),
                      ("session_id", 12), ("push_token", "g" * 32), ("push_token", "f" * 31)):  # fmt: skip
        with pytest.raises(BadRequest, match=f"{name}.*hex digits"):
            m.OpenSession.from_wire({**good, name: bad})


def test_plain_json_forms():
    hidden = [[[0.5] * H, [1.0] * H]]
    req = m.ForwardRequest.from_json(
        {"start_block": 0, "end_block": 2, "hidden_states": hidden}, default_model="fp"
    )
    assert req.model == "fp" and req.hidden_states.shape == (1, 2, H)
    assert req.hidden_states.dtype == torch.float32
    with pytest.raises(BadTensor, match="rectangular"):
        m.ForwardRequest.from_json(
            {"start_block": 0, "end_block": 2, "hidden_states": [[[1.0], [1.0, 2.0]]]},
            default_model="fp",
        )
    with pytest.raises(BadRequest, match="grad_outputs"):
        m.BackwardRequest.from_json(
            {"start_block": 0, "end_block": 2, "hidden_states": hidden}, default_model="fp"
        )
    back = m.BackwardRequest.from_json(
        {"start_block": 0, "end_block": 2, "hidden_states": hidden, "grad_outputs": hidden},
        default_model="fp",
    )
    assert torch.equal(back.grad_outputs, back.hidden_states)
    assert m.ForwardResponse(req.hidden_states).to_json() == {"hidden_states": hidden}


def test_wire_dtype_refused_at_encode():
    with pytest.raises(BadTensor, match="cannot travel"):
        encode_frame({}, {"t": torch.zeros(2, dtype=torch.float64)})


def test_adapter_field_only_when_asked():
    assert "adapter" not in m.ForwardRequest("fp", 0, 1, _hidden()).to_wire()[0]
    assert "adapter" not in m.OpenSession("fp", 0, 4, 128, 2, "float32").to_wire()
    params, tensors = m.ForwardRequest("fp", 0, 1, _hidden()).to_wire()
    for bad in (3, "", "a:b", "x" * 65):
        with pytest.raises(BadRequest, match="adapter"):
            m.ForwardRequest.from_wire(params | {"adapter": bad}, tensors)


def test_idle_is_announced_only_by_servers_that_take_it():
    """A server that predates `idle` sends no `idles`: its client never sends it one."""
    old = m.SessionOpened("abc", 128).to_wire()
    assert "idles" not in old and m.SessionOpened.from_wire(old).idles is False
    assert m.SessionOpened.from_wire({**old, "idles": True}).idles is True
    with pytest.raises(BadRequest, match="idles"):
        m.SessionOpened.from_wire({**old, "idles": "yes"})
    with pytest.raises(BadRequest, match="type 'idle'"):
        m.IdleSession.from_wire(m.CloseSession().to_wire())
