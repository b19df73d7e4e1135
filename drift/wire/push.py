"""Server-to-server push of inference steps: the hops a step names, and the reply's verdict.

A client's step frame may carry `next`: the spans after this one, each as `{"addr",
"peer_id", "session_id", "step_id"}`. The server runs the step, forwards its output to the
first of them (over a /push WebSocket, the frame's `session_id` naming the session there
and `next` the rest: `StepRequest.onward`, drift.wire.step), and replies to the client as usual, its reply saying `pushed: true`
or `push_error: <why>`. Each server of the chain replies to the client on that session's
own socket, so the client sees every span's output (its history, for replay) while only the
first step crossed its uplink. Knows nothing about sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drift.wire import checks as c
from drift.wire.addr import addr_problem
from drift.wire.errors import BadRequest

NEXT = "next"  # step param: the hops after this span
SESSION = "session_id"  # pushed step param: the session on the receiving server
PUSHED = "pushed"  # reply param: the step went on to the next hop
PUSH_ERROR = "push_error"  # reply param: why it did not (the client relays from there)
MAX_HOPS = 64  # a longer chain is refused: a step names at most this many hops


@dataclass(frozen=True)
class NextHop:
    """A span after this one: where it is, who it is, its session and step id there."""

    addr: str  # http(s)://host:port of the peer, as the swarm table announces it
    peer_id: str
    session_id: str
    step_id: int  # the id the client expects that span's reply under

    def to_wire(self) -> dict[str, Any]:
        return {"addr": self.addr, "peer_id": self.peer_id, "session_id": self.session_id,
                "step_id": self.step_id}  # fmt: skip


def parse_next(params: dict[str, Any]) -> tuple[NextHop, ...]:
    """The hops a step names (empty when it names none); BadRequest for a malformed list."""
    raw = params.get(NEXT)
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_HOPS:
        raise BadRequest(f"field {NEXT!r} must be a list of at most {MAX_HOPS} hops")
    hops = []
    for item in raw:
        if not isinstance(item, dict):
            raise BadRequest(f"each hop of {NEXT!r} must be an object with addr, peer_id, "
                             "session_id and step_id")  # fmt: skip
        addr = c.get_str(item, "addr").rstrip("/")  # a trailing slash is the same address
        problem = addr_problem(addr)
        if problem is not None:
            raise BadRequest(f"hop of {NEXT!r}: {problem}")
        hops.append(NextHop(addr, c.get_str(item, "peer_id"),
                            c.get_str(item, SESSION), c.get_int(item, "step_id")))  # fmt: skip
    return tuple(hops)


def pushed_session(params: dict[str, Any]) -> str:
    """The session a pushed step is for."""
    return c.get_str(params, SESSION)
