"""Signed records and the table's merge rules: forged, altered, replayed, expired records."""

from __future__ import annotations

import base64
import dataclasses

import orjson
import pytest

from drift import PROTOCOL_VERSION
from drift.identity import Identity
from drift.swarm import MembershipTable, PeerRecord, default_fields, sign_record
from drift.wire.errors import BadRequest
from tests.swarm.swarm_helpers import NOW, make_record


def test_record_round_trips_and_verifies() -> None:
    rec = make_record(span=(0, 4), throughput=12)
    wire = orjson.loads(orjson.dumps(rec.to_wire()))
    back = PeerRecord.from_wire(wire)
    assert back == rec and back.verify()
    assert back.canonical() == orjson.dumps(
        {k: v for k, v in wire.items() if k != "signature"}, option=orjson.OPT_SORT_KEYS
    )


def test_unknown_fields_from_newer_peers_are_kept_and_verified() -> None:
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, ["http://x:1"], "0.2.0") | {"expires_at": NOW + 5}
    fields["new_field"] = [1, 2]
    from drift.swarm.record import canonical_bytes

    sig = base64.b64encode(ident.sign(canonical_bytes(fields))).decode()
    rec = PeerRecord.from_wire(fields | {"signature": sig})
    assert rec.verify() and rec.to_wire()["new_field"] == [1, 2]
    with pytest.raises(BadRequest, match="unknown record fields"):
        sign_record(ident, fields)


def test_adapters_field_is_optional_signed_and_checked() -> None:
    plain = make_record(span=(0, 4))
    assert "adapters" not in plain.to_wire() and plain.adapters == ()  # as older peers sign
    rec = make_record(span=(0, 4), adapters=["chat", "sql"])
    back = PeerRecord.from_wire(orjson.loads(orjson.dumps(rec.to_wire())))
    assert back.adapters == ("chat", "sql") and back.verify()
    assert dict(back.extra) == {"protocol": PROTOCOL_VERSION}  # nothing else left over
    for bad in ("chat", ["a:b"], ["x"] * 2, [str(i) for i in range(17)]):
        with pytest.raises(BadRequest, match="adapters"):
            PeerRecord.from_wire(rec.to_wire() | {"adapters": bad})


def test_only_the_peer_itself_can_sign() -> None:
    a, b = Identity.generate(), Identity.generate()
    with pytest.raises(BadRequest, match="only be signed by the peer it describes"):
        sign_record(b, default_fields(a.peer_id, [], "0.1.0"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("seq", "1"), ("throughput", True), ("addrs", [1]), ("state", "dead"), ("start_block", 5)],
)
def test_malformed_records_rejected(field: str, value: object) -> None:
    wire = make_record(span=(0, 4)).to_wire()
    wire[field] = value
    with pytest.raises(BadRequest):
        PeerRecord.from_wire(wire)


def test_merge_higher_seq_wins_and_replay_is_stale() -> None:
    ident = Identity.generate()
    table = MembershipTable()
    old, new = make_record(ident, seq=1), make_record(ident, seq=2, throughput=5.0)
    assert table.merge(old, NOW) and table.merge(new, NOW)
    assert not table.merge(old, NOW)  # replayed older record
    assert table.get(ident.peer_id) == new and table.rejected["stale"] == 1
    assert not table.merge(new, NOW)  # same record again: no change, not an error


def test_forged_records_never_reach_the_table() -> None:
    victim, attacker = Identity.generate(), Identity.generate()
    table = MembershipTable()
    genuine = make_record(victim, seq=3)
    table.merge(genuine, NOW)
    # altered field, signature kept
    altered = dataclasses.replace(genuine, seq=4, throughput=999.0)
    # signed by another key, claiming the victim's peer id
    forged_fields = genuine.fields() | {"seq": 5}
    from drift.swarm.record import canonical_bytes

    forged_sig = base64.b64encode(attacker.sign(canonical_bytes(forged_fields))).decode()
    forged = PeerRecord.from_wire(forged_fields | {"signature": forged_sig})
    garbage = dataclasses.replace(genuine, seq=6, signature="not base64!")
    for bad in (altered, forged, garbage):
        assert not table.merge(bad, NOW)
    assert table.get(victim.peer_id) == genuine
    assert table.rejected["bad_signature"] == 3


def test_expired_records_dropped_and_not_accepted() -> None:
    table = MembershipTable()
    rec = make_record(expires_at=NOW + 1)
    assert not table.merge(make_record(expires_at=NOW - 1), NOW)
    assert table.rejected["expired"] == 1
    assert table.merge(rec, NOW) and table.live(NOW) == [rec]
    assert table.expire(NOW + 2) == [rec.peer_id] and len(table) == 0
    # after expiry, replaying the record (or any older one) cannot revive the peer
    assert not table.merge(rec, NOW + 2) and table.rejected["expired"] == 2


def test_offline_is_not_live_and_merge_wire_counts_malformed() -> None:
    ident = Identity.generate()
    table = MembershipTable()
    table.merge(make_record(ident, seq=1), NOW)
    changed = table.merge_wire(
        [make_record(ident, seq=2, state="offline").to_wire(), {"peer_id": 1}, "x"], NOW
    )
    assert changed == 1 and table.rejected["malformed"] == 2
    assert table.live(NOW) == [] and len(table.records()) == 1
