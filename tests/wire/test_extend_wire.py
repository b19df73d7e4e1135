"""`extend` and `session_extended`: they round-trip; each bad form is refused by name."""

from __future__ import annotations

import pytest

from drift import PROTOCOL_VERSION
from drift.wire.errors import BadRequest, VersionMismatch
from drift.wire.extend import ExtendSession, SessionExtended


def test_round_trip():
    assert ExtendSession.from_wire(ExtendSession(4096).to_wire()) == ExtendSession(4096)
    reply = SessionExtended("ab12", 4096)
    assert SessionExtended.from_wire(reply.to_wire()) == reply
    assert ExtendSession(7).to_wire() == {"type": "extend", "version": PROTOCOL_VERSION,
                                          "max_length": 7}  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "error", "match"),
    [
        ([], BadRequest, "expected a message of type 'extend', got 'list'"),
        ({"type": "open", "version": PROTOCOL_VERSION}, BadRequest, "got 'open'"),
        ({"type": "extend", "max_length": 8}, BadRequest, "missing 'version'"),
        ({"type": "extend", "version": "999.0", "max_length": 8}, VersionMismatch, "999.0"),
        ({"type": "extend", "version": PROTOCOL_VERSION}, BadRequest, "missing field 'max_length'"),
        ({"type": "extend", "version": PROTOCOL_VERSION, "max_length": 0}, BadRequest,
         "'max_length' = 0 is out of range"),
        ({"type": "extend", "version": PROTOCOL_VERSION, "max_length": "8"}, BadRequest,
         "'max_length' must be an integer"),
        ({"type": "extend", "version": PROTOCOL_VERSION, "max_length": True}, BadRequest,
         "'max_length' must be an integer"),
    ],
)  # fmt: skip
def test_bad_extend_is_refused(obj, error, match):
    with pytest.raises(error, match=match):
        ExtendSession.from_wire(obj)


def test_bad_reply_is_refused():
    with pytest.raises(BadRequest, match="field 'session_id' must be a non-empty string"):
        SessionExtended.from_wire({"type": "session_extended", "version": PROTOCOL_VERSION,
                                   "max_length": 8})  # fmt: skip
