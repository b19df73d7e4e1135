"""Growing an open inference session in place: `extend` and its reply `session_extended`.

A client whose session needs room for more tokens than it opened with sends, as JSON text on
the session's socket between steps, `{"type": "extend", "max_length": N}`. The server
reserves the extra KV-cache room and keeps everything the session holds (its cache, mask and
position): nothing is replayed. It answers `session_extended` with the new max_length, or
an error (LengthExceeded past its limit, CacheFull without room); the session is then as it
was. A max_length not above the session's own changes nothing. Knows nothing about sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drift.wire import checks as c
from drift.wire.version import PROTOCOL_VERSION

EXTEND = "extend"
EXTENDED = "session_extended"


@dataclass(frozen=True)
class ExtendSession:
    """Room for `max_length` tokens (prompt included) in the socket's session."""

    max_length: int

    @classmethod
    def from_wire(cls, obj: Any) -> ExtendSession:
        return cls(c.get_int(c.typed_object(obj, EXTEND), "max_length", low=1))

    def to_wire(self) -> dict[str, Any]:
        return {"type": EXTEND, "version": PROTOCOL_VERSION, "max_length": self.max_length}


@dataclass(frozen=True)
class SessionExtended:
    """The session now holds room for `max_length` tokens."""

    session_id: str
    max_length: int

    @classmethod
    def from_wire(cls, obj: Any) -> SessionExtended:
        obj = c.typed_object(obj, EXTENDED)
        return cls(c.get_str(obj, "session_id"), c.get_int(obj, "max_length", low=1))

    def to_wire(self) -> dict[str, Any]:
        return {"type": EXTENDED, "version": PROTOCOL_VERSION, "session_id": self.session_id,
                "max_length": self.max_length}  # fmt: skip
