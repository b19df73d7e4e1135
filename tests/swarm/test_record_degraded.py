"""`degraded_s` (the compute watchdog's field) is compatible with peers of the previous
version: main's record.py, which does not know the field, decodes and verifies such a
record and keeps the field (so it forwards it signed); only this version reads it."""

from __future__ import annotations

import time

from drift.identity.keys import Identity
from drift.swarm.record import PeerRecord, default_fields, sign_record
from tests.swarm.swarm_helpers import previous_record_module


def test_old_decoders_keep_and_verify_a_degraded_record(tmp_path) -> None:
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, ["http://127.0.0.1:1"], "0.1.0")
    fields.update(seq=1, expires_at=time.time() + 60, degraded_s=31.5)
    record = sign_record(ident, fields)
    assert record.degraded and record.verify()
    old = previous_record_module("a2fb79e", tmp_path, lacks="degraded_s").PeerRecord.from_wire(
        record.to_wire()
    )
    assert old.verify() and old.to_wire() == record.to_wire()
    healthy = sign_record(ident, {**fields, "degraded_s": 0.0})
    assert not PeerRecord.from_wire(healthy.to_wire()).degraded
