"""The `next` hops of a pushed step (drift.wire.push): parsed strictly, re-addressed per hop."""

from __future__ import annotations

import pytest

from drift.wire.errors import BadRequest
from drift.wire.push import MAX_HOPS, NEXT, NextHop, onward_params, parse_next

HOP = {"addr": "http://127.0.0.1:1234/", "peer_id": "12D3KooWPeer", "session_id": "s1",
       "step_id": 7}  # fmt: skip


def test_parse_and_onward():
    assert parse_next({}) == ()
    two = parse_next({NEXT: [HOP, dict(HOP, peer_id="12D3KooWOther", step_id=3)]})
    assert two[0] == NextHop("http://127.0.0.1:1234", "12D3KooWPeer", "s1", 7)
    params = {"type": "step", "version": "1.0", "step_id": 1, "position": 4, NEXT: []}
    first = onward_params(params, two)
    assert first["step_id"] == 7 and first["session_id"] == "s1" and first["position"] == 4
    assert first[NEXT] == [two[1].to_wire()]
    last = onward_params(first, two[1:])
    assert NEXT not in last and last["step_id"] == 3 and last["type"] == "step"


@pytest.mark.parametrize(("value", "match"), [
    ("http://x", "list"), ([HOP] * (MAX_HOPS + 1), "at most"), ([1], "object"),
    ([dict(HOP, addr="ftp://x")], "http"), ([dict(HOP, peer_id="")], "peer_id"),
    ([dict(HOP, step_id=-1)], "step_id"), ([{k: v for k, v in HOP.items() if k != "session_id"}],
                                           "session_id"),
])  # fmt: skip
def test_malformed_hops_are_refused(value, match):
    with pytest.raises(BadRequest, match=match):
        parse_next({NEXT: value})
