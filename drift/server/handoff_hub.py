"""What a server keeps about handoffs (drift.server.handoff): sessions being handed over,
moved ones and their new home, sessions handed to it and parked, offers already taken."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from aiohttp import web

from drift.wire.handoff import SessionMoved

# A session handed to this server waits this long for its client to resume it: a client
# that steps learns of the move at once; one that does not (gone, or an idle held session)
# replays if it comes back later, and the room is not held for the whole session_timeout.
PARK_TIMEOUT_S = 60.0


@dataclass
class HandoffHub:
    """Per server: sessions being handed over (steps wait), moved ones (steps hear where),
    and sessions handed to this server, parked until their client resumes them."""

    pending: dict[str, asyncio.Event] = field(default_factory=dict)
    moved: dict[str, SessionMoved] = field(default_factory=dict)
    parked: dict[str, str] = field(default_factory=dict)  # session id -> resume token
    parked_at: dict[str, float] = field(default_factory=dict)  # session id -> monotonic time
    nonces: set[str] = field(default_factory=set)  # offers taken (a replayed one is refused)
    # the client sockets of moved sessions, open until their clients leave for the new home
    left_open: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    draining: bool = False

    def park(self, session_id: str, token: str, now: float) -> None:
        self.parked[session_id], self.parked_at[session_id] = token, now

    def unpark(self, session_id: str) -> None:
        self.parked.pop(session_id, None)
        self.parked_at.pop(session_id, None)

    def unclaimed(self, now: float, after_s: float = PARK_TIMEOUT_S) -> list[str]:
        """Sessions handed here that no client resumed within `after_s` (its client left,
        or the session was an idle one nobody steps again): to be closed."""
        return [sid for sid, at in self.parked_at.items() if now - at > after_s]

    async def answer_moved(self, ws: web.WebSocketResponse, session_id: str | None,
                           step_id: int | None) -> bool:  # fmt: skip
        """Hook before a step (`step_id`: the frame's, None when it names no well-formed
        one): wait out a transfer of its session; True (and the client told where its
        session lives) when it moved."""
        if session_id is None:
            return False
        event = self.pending.get(session_id)
        if event is not None:
            await event.wait()
        moved = self.moved.get(session_id)
        if moved is None:
            return False
        await _send(ws, replace(moved, step_id=step_id).to_wire())
        return True


async def _send(ws: web.WebSocketResponse, obj: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(orjson.dumps(obj).decode())
