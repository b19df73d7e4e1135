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


@dataclass
class HandoffHub:
    """Per server: sessions being handed over (steps wait), moved ones (steps hear where),
    and sessions handed to this server, parked until their client resumes them."""

    pending: dict[str, asyncio.Event] = field(default_factory=dict)
    moved: dict[str, SessionMoved] = field(default_factory=dict)
    parked: dict[str, str] = field(default_factory=dict)  # session id -> resume token
    nonces: set[str] = field(default_factory=set)  # offers taken (a replayed one is refused)
    # the client sockets of moved sessions, open until their clients leave for the new home
    left_open: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    draining: bool = False

    async def answer_moved(self, ws: web.WebSocketResponse, session_id: str | None,
                           step_id: object) -> bool:  # fmt: skip
        """Hook before a step: wait out a transfer of its session; True (and the client told
        where its session lives) when it moved."""
        if session_id is None:
            return False
        event = self.pending.get(session_id)
        if event is not None:
            await event.wait()
        moved = self.moved.get(session_id)
        if moved is None:
            return False
        step = step_id if isinstance(step_id, int) and not isinstance(step_id, bool) else None
        await _send(ws, replace(moved, step_id=step).to_wire())
        return True


async def _send(ws: web.WebSocketResponse, obj: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(orjson.dumps(obj).decode())
