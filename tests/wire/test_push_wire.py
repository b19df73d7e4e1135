"""The `next` hops of a pushed step (drift.wire.push): parsed strictly, re-addressed per hop."""

from __future__ import annotations

import pytest
import torch

from drift.wire import codec
from drift.wire.errors import BadRequest, PushForbidden
from drift.wire.frames import decode_frame
from drift.wire.messages import SessionOpened
from drift.wire.push import (
    MAX_HOPS,
    NEXT,
    PUSH_ERROR,
    PUSHED,
    SESSION,
    TOKEN,
    NextHop,
    PushTarget,
    parse_next,
)
from drift.wire.step import StepRequest, StepResponse

HOP = {"addr": "http://127.0.0.1:1234/", "peer_id": "12D3KooWPeer", "session_id": "s1",
       "step_id": 7}  # fmt: skip


def test_parse_and_onward():
    assert parse_next({}) == ()
    two = parse_next({NEXT: [HOP, dict(HOP, peer_id="12D3KooWOther", step_id=3)]})
    assert two[0] == NextHop("http://127.0.0.1:1234", "12D3KooWPeer", "s1", 7)
    hidden, out = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    mask = torch.ones(1, 2, dtype=torch.int64)
    step = StepRequest(1, 4, hidden, attention_mask=mask, next_hops=two)
    first = step.onward(out)
    assert (first.step_id, first.session_id, first.position) == (7, "s1", 4)
    assert first.next_hops == two[1:] and first.hidden_states is out
    assert torch.equal(first.attention_mask, mask)
    last = first.onward(hidden)
    assert last.next_hops == () and last.step_id == 3 and last.session_id == "s1"


def test_push_fields_travel_typed_under_their_old_names():
    """`next`, `session_id`, `pushed`, `push_error` keep their wire names (earlier peers read
    them) and come back as typed fields, validated in from_wire."""
    hops = parse_next({NEXT: [HOP]})
    step = StepRequest(2, 0, torch.randn(1, 1, 8), next_hops=hops, session_id="s0")
    params, _ = decode_frame(codec.encode(step, "float16"))
    assert params[NEXT] == [hops[0].to_wire()] and params[SESSION] == "s0"
    back = codec.decode(StepRequest, codec.encode(step, "float16"))
    assert back.next_hops == hops and back.session_id == "s0"
    plain = decode_frame(codec.encode(StepRequest(2, 0, torch.randn(1, 1, 8))))[0]
    assert NEXT not in plain and SESSION not in plain
    for reply in (StepResponse(2, torch.randn(1, 1, 8), pushed=True),
                  StepResponse(2, torch.randn(1, 1, 8), push_error="no link")):  # fmt: skip
        params, _ = decode_frame(codec.encode(reply))
        assert params.get(PUSHED) is (True if reply.pushed else None)
        assert params.get(PUSH_ERROR) == reply.push_error
        got = codec.decode(StepResponse, codec.encode(reply))
        assert (got.pushed, got.push_error) == (reply.pushed, reply.push_error)


def test_a_pushed_step_must_be_plain():
    hops = parse_next({NEXT: [HOP]})
    step = StepRequest(2, 0, torch.randn(1, 1, 8), block_states=True, next_hops=hops)
    with pytest.raises(BadRequest, match="cannot be pushed"):
        codec.decode(StepRequest, codec.encode(step))
    bad = StepResponse(2, torch.randn(1, 1, 8))
    params, tensors = bad.to_wire()
    with pytest.raises(BadRequest, match=PUSHED):
        StepResponse.from_wire(dict(params, **{PUSHED: "yes"}), tensors)


@pytest.mark.parametrize(("value", "match"), [
    ("http://x", "list"), ([HOP] * (MAX_HOPS + 1), "at most"), ([1], "object"),
    ([dict(HOP, addr="ftp://x")], "http"), ([dict(HOP, peer_id="")], "peer_id"),
    ([dict(HOP, step_id=-1)], "step_id"), ([{k: v for k, v in HOP.items() if k != "session_id"}],
                                           "session_id"),
])  # fmt: skip
def test_malformed_hops_are_refused(value, match):
    with pytest.raises(BadRequest, match=match):
        parse_next({NEXT: value})


def test_the_push_token_travels_with_its_hop_and_never_in_a_repr():
    hops = parse_next({NEXT: [dict(HOP, push_token="t" * 32), HOP]})
    assert hops[0].push_token == "t" * 32 and hops[1].push_token is None
    assert "t" * 32 not in repr(hops[0])
    step = StepRequest(2, 0, torch.randn(1, 1, 8), next_hops=hops)
    first = step.onward(torch.randn(1, 1, 8))
    assert first.push_token == "t" * 32 and "t" * 32 not in repr(first)
    back = codec.decode(StepRequest, codec.encode(first))
    assert back.push_token == "t" * 32 and back.session_id == "s1"
    assert codec.Frame.read(codec.encode(first)).push_target() == PushTarget("s1", "t" * 32)
    assert first.onward(torch.randn(1, 1, 8)).push_token is None  # the second hop named none
    with pytest.raises(BadRequest, match=TOKEN):
        parse_next({NEXT: [dict(HOP, push_token=5)]})


def test_a_push_without_the_sessions_token_is_forbidden():
    PushTarget("s1", "t" * 32).check("t" * 32)
    for got in (None, "", "u" * 32, "t" * 31):
        with pytest.raises(PushForbidden, match="push_token") as info:
            PushTarget("s1", got).check("t" * 32)
        assert info.value.status == 403 and "s1" in info.value.message


def test_session_opened_carries_the_token_and_reads_an_older_servers_reply():
    opened = SessionOpened("s1", 64, "t" * 32)
    assert SessionOpened.from_wire(opened.to_wire()) == opened
    assert "t" * 32 not in repr(opened)
    older = {k: v for k, v in opened.to_wire().items() if k != TOKEN}
    assert SessionOpened.from_wire(older).push_token is None
