"""`degraded_s` (the compute watchdog's field) is compatible with peers of the previous
version: main's record.py, which does not know the field, decodes and verifies such a
record and keeps the field (so it forwards it signed); only this version reads it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

from drift.identity.keys import Identity
from drift.swarm.record import PeerRecord, default_fields, sign_record


def _previous_record_module(tmp_path: Path):
    """drift/swarm/record.py as of the commit before the field (loaded beside this one)."""
    src = subprocess.run(["git", "show", "a2fb79e:drift/swarm/record.py"], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parents[2]).stdout  # fmt: skip
    assert "degraded_s" not in src
    path = tmp_path / "old_record.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_record", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_record"] = module
    spec.loader.exec_module(module)
    return module


def test_old_decoders_keep_and_verify_a_degraded_record(tmp_path) -> None:
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, ["http://127.0.0.1:1"], "0.1.0")
    fields.update(seq=1, expires_at=time.time() + 60, degraded_s=31.5)
    record = sign_record(ident, fields)
    assert record.degraded and record.verify()
    old = _previous_record_module(tmp_path).PeerRecord.from_wire(record.to_wire())
    assert old.verify() and old.to_wire() == record.to_wire()
    healthy = sign_record(ident, {**fields, "degraded_s": 0.0})
    assert not PeerRecord.from_wire(healthy.to_wire()).degraded
