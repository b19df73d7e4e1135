"""A record's `compute` name (drift.server.compute_name): signed like every field, checked on
decode, absent from records that do not set it, and kept by peers that predate it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from drift.identity.keys import Identity
from drift.swarm.record import PeerRecord, default_fields, sign_record
from drift.wire.errors import BadRequest
from tests.swarm.swarm_helpers import previous_record_module


def _fields(ident: Identity) -> dict:
    fields = default_fields(ident.peer_id, ["http://127.0.0.1:1"], "0.1.0")
    fields.update(seq=1, expires_at=time.time() + 60)
    return fields


def test_compute_round_trips_signed_and_is_checked() -> None:
    ident = Identity.generate()
    plain = sign_record(ident, _fields(ident))
    assert plain.compute is None and "compute" not in plain.to_wire()
    named = sign_record(ident, {**_fields(ident), "compute": "0123456789abcdef"})
    back = PeerRecord.from_wire(named.to_wire())
    assert back.compute == "0123456789abcdef" and back.verify()
    for bad in ("", "a b", "x" * 65, 7):
        with pytest.raises(BadRequest, match="'compute'"):
            PeerRecord.from_wire({**named.to_wire(), "compute": bad})


def test_a_peer_of_the_previous_version_keeps_and_verifies_it(tmp_path: Path) -> None:
    module = previous_record_module("4afc6c6", tmp_path, lacks="COMPUTE_FIELD")
    ident = Identity.generate()
    record = sign_record(ident, {**_fields(ident), "compute": "0123456789abcdef"})
    old = module.PeerRecord.from_wire(record.to_wire())
    assert old.verify() and old.to_wire() == record.to_wire()
