"""GET /compute: whether a server's compute thread advances, and whether it holds a step of
a given session.

A client whose step (or named /forward or /backward call) has not come back within its
timeout asks the server (by HTTP, beside the session's socket) before leaving it as failed: a server busy with other clients' work
answers that its running unit began recently and that the step is there; a frozen one
(a unit running far longer than its units take) or one that lost the step does not. Knows
nothing about sockets or threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drift.wire import checks as c
from drift.wire.errors import BadRequest
from drift.wire.version import PROTOCOL_VERSION

COMPUTE_PATH = "/compute"
STATUS = "compute_status"
# A /forward or /backward request may name itself (a random token of at most 64 characters)
# so that GET /compute?call=ID says whether it is still being served.
CALL_HEADER = "X-Drift-Call"
MAX_CALL_ID = 64


def _seconds(obj: dict[str, Any], name: str, *, optional: bool = False) -> float | None:
    value = obj.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"field {name!r} must be a number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ComputeStatus:
    """The compute thread now: how long its running unit has run (0: idle), how many units
    wait behind it, how long one unit of this span should take at most (None: its pace was
    not measured), and whether the asked session has a step here (queued or running), or
    the asked call is still being served."""

    running_s: float
    waiting: int
    unit_s: float | None
    pending: bool

    @classmethod
    def from_wire(cls, obj: Any) -> ComputeStatus:
        obj = c.typed_object(obj, STATUS)
        running = _seconds(obj, "running_s")
        assert running is not None
        return cls(running, c.get_int(obj, "waiting"), _seconds(obj, "unit_s", optional=True),
                   c.get_flag(obj, "pending"))  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        return {"type": STATUS, "version": PROTOCOL_VERSION, "running_s": self.running_s,
                "waiting": self.waiting, "unit_s": self.unit_s, "pending": self.pending}  # fmt: skip
