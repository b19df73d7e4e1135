"""Server-to-server push of inference steps: the hops a step names, and the reply's verdict.

A client's step frame may carry `next`: the spans after this one, each as `{"addr",
"peer_id", "session_id", "step_id", "push_token"}`. The server runs the step, forwards its output to the
first of them (over a /push WebSocket, the frame's `session_id` naming the session there
and `next` the rest: `StepRequest.onward`, drift.wire.step), and replies to the client as usual, its reply saying `pushed: true`
or `push_error: <why>`. Each server of the chain replies to the client on that session's
own socket, so the client sees every span's output (its history, for replay) while only the
first step crossed its uplink.

A pushed step is bound to its session by more than the session id (64 bits, and named in
logs and errors): the server issues each session a secret `push_token` (128 random bits) at
open (`session_opened`); the client names it only in the hop it hands the previous server,
and every pushed step carries it. A push whose token does not match is refused
(`PushForbidden`) on the link it came over, before it touches the session.
Knows nothing about sockets.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from drift.wire import checks as c
from drift.wire.addr import addr_problem
from drift.wire.errors import BadRequest, PushForbidden

NEXT = "next"  # step param: the hops after this span
SESSION = "session_id"  # pushed step param: the session on the receiving server
TOKEN = "push_token"  # hop and pushed step param: the session's secret push token
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
    # the session's push token there (None: its server issued none, an older one; then
    # nobody pushes to it: drift.server.push.check_member); a secret, so never in a repr
    push_token: str | None = field(default=None, repr=False)

    def to_wire(self) -> dict[str, Any]:
        out = {"addr": self.addr, "peer_id": self.peer_id, "session_id": self.session_id,
               "step_id": self.step_id}  # fmt: skip
        if self.push_token is not None:
            out[TOKEN] = self.push_token
        return out


@dataclass(frozen=True)
class PushTarget:
    """Whom a pushed step is for: the session on the receiving server and its push token."""

    session_id: str
    push_token: str | None = field(repr=False)  # None: the pusher sent none (refused)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PushTarget:
        """BadRequest when the frame names no session (or a token that is not a string)."""
        token = params.get(TOKEN)
        if token is not None and not isinstance(token, str):
            raise BadRequest(f"field {TOKEN!r} must be a string")
        return cls(c.get_str(params, SESSION), token)

    def check(self, expected: str) -> None:
        """PushForbidden unless this push carries the session's token (compared in constant
        time; the message is the same for a missing and a wrong one)."""
        got = self.push_token
        if got is None or not hmac.compare_digest(got.encode(), expected.encode()):
            raise forbidden(self.session_id)


def forbidden(session_id: str) -> PushForbidden:
    """The one refusal of a push a session does not take: unknown, closed, or a missing or
    wrong push token (the same words for each, so it tells a prober nothing)."""
    return PushForbidden(f"refused a pushed step for session {session_id}: no session here "
                         f"takes it (unknown or closed, or a missing or wrong {TOKEN}); "
                         "only the session's previous server, named by its client, can push "
                         "into it", session_id=session_id)  # fmt: skip


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
        token = item.get(TOKEN)
        if token is not None and not isinstance(token, str):
            raise BadRequest(f"hop of {NEXT!r}: field {TOKEN!r} must be a string")
        addr = c.get_str(item, "addr").rstrip("/")  # a trailing slash is the same address
        problem = addr_problem(addr)
        if problem is not None:
            raise BadRequest(f"hop of {NEXT!r}: {problem}")
        hops.append(NextHop(addr, c.get_str(item, "peer_id"),
                            c.get_str(item, SESSION), c.get_int(item, "step_id"),
                            token))  # fmt: skip
    return tuple(hops)


def pushed_target(params: dict[str, Any]) -> PushTarget:
    """The session a pushed step is for, with the token it carries."""
    return PushTarget.from_params(params)
