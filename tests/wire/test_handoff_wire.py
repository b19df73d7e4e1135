"""drift.wire.handoff: the offer, pieces and moved notice round-trip and refuse what lies."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drift.identity import Identity, verify_signature
from drift.swarm.record import PeerRecord, default_fields, sign_record
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.handoff import (
    HandoffOffer,
    HandoffPiece,
    LayerKV,
    SessionMoved,
    SessionMovedError,
    raise_if_moved,
)

SHAPE = (1, 2, 5, 4)  # [B, kv_heads, tokens, head_dim]


def offer(**change: object) -> HandoffOffer:
    base = HandoffOffer("12D3KooWsender", "12D3KooWtarget", "n1", 1.0e9, "fp", 2, 4, 5, 64, 1,
                        "float32", "float32", None, (LayerKV(2, SHAPE, None), LayerKV(3, SHAPE, 5)),
                        2)  # fmt: skip
    return dataclasses.replace(base, **change)  # type: ignore[arg-type]


def test_offer_round_trips_and_its_signature_covers_every_field():
    ident = Identity.generate()
    o = offer(sender=ident.peer_id)
    import base64

    signed = dataclasses.replace(
        o, signature=base64.b64encode(ident.sign(o.signed_bytes())).decode()
    )
    back = HandoffOffer.from_wire(signed.to_wire())
    assert back == signed
    assert verify_signature(ident.peer_id, back.signed_bytes(), back.signature_bytes())
    moved = dataclasses.replace(back, start_block=0)
    assert not verify_signature(ident.peer_id, moved.signed_bytes(), back.signature_bytes())
    assert back.kv_bytes() == 2 * 2 * 4 * (1 * 2 * 5 * 4)


@pytest.mark.parametrize("field,value", [
    ("position", 65), ("position", 0), ("kv_dtype", "int8"), ("pieces", 0),
    ("layers", [{"block": 2, "shape": [2, 2, 5, 4], "cumulative": None}]),  # batch of 2, not 1
    ("layers", [{"block": 2, "shape": [1, 2, 5], "cumulative": None}]),
    ("layers", []), ("issued_at", "now"),
])  # fmt: skip
def test_offer_refuses_bad_fields(field, value):
    wire = offer().to_wire()
    wire[field] = value
    with pytest.raises(BadRequest):
        HandoffOffer.from_wire(wire)


def test_pieces_must_fit_the_offer():
    o = offer()
    kv = torch.zeros(1, 2, 3, 4)
    mask = torch.ones(1, 5, dtype=torch.bool)
    first = HandoffPiece(0, 2, 0, kv, kv, mask)
    params, tensors = first.to_wire()
    back = HandoffPiece.from_wire(params, tensors, o)
    assert back.block == 2 and torch.equal(back.keys, kv) and back.mask is not None
    with pytest.raises(BadRequest):  # tokens 3..6 of a 5-token layer
        HandoffPiece.from_wire(*dataclasses.replace(first, t0=3).to_wire(), o)
    with pytest.raises(BadRequest):  # a block the offer does not name
        HandoffPiece.from_wire(*dataclasses.replace(first, block=1).to_wire(), o)
    with pytest.raises(BadRequest):  # the first piece carries the mask
        HandoffPiece.from_wire(*dataclasses.replace(first, mask=None).to_wire(), o)
    with pytest.raises(BadRequest):  # another dtype than announced
        half = kv.to(torch.float16)
        HandoffPiece.from_wire(*HandoffPiece(0, 2, 0, half, half, mask).to_wire(), o)
    params, tensors = first.to_wire()
    with pytest.raises(BadTensor):
        HandoffPiece.from_wire(params, {**tensors, "extra": kv}, o)


def test_moved_notice_round_trips_and_raises():
    moved = SessionMoved("https://127.0.0.1:9", "12D3KooWx", "abc", "tok", 7)
    assert SessionMoved.from_wire(moved.to_wire()) == moved
    with pytest.raises(SessionMovedError) as info:
        raise_if_moved(moved.to_wire())
    assert info.value.details["addr"] == "https://127.0.0.1:9"
    raise_if_moved({"type": "error", "code": "busy"})  # not a move: nothing raised
    bad = dict(moved.to_wire(), addr="https://evil/path")
    with pytest.raises(BadRequest):
        SessionMoved.from_wire(bad)


def test_a_draining_record_stays_online_for_older_peers_and_serves_nothing():
    ident = Identity.generate()
    fields = dict(default_fields(ident.peer_id, ["https://127.0.0.1:1"], "0.1.0"), role="server",
                  model="m", model_fingerprint="fp", num_blocks=4, start_block=0, end_block=4)  # fmt: skip
    online = sign_record(ident, fields)
    draining = sign_record(ident, dict(fields, draining=1))
    assert online.serves(0) and not draining.serves(0)
    assert draining.state == "online" and PeerRecord.from_wire(draining.to_wire()).verify()
