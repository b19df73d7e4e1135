"""Following a session that a draining server handed to another one (drift.wire.handoff).

When a span's server says `session_moved` (with a step's reply, or left on the socket
before it closed), the span's socket is replaced by one to the new server that resumes the
session there: its KV cache came along, so nothing is replayed and the history stays for a
later failover. A resume that fails leaves the caller to fail over (replay) as before.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

import aiohttp
import orjson

from drift.wire.errors import DriftError
from drift.wire.handoff import MOVED, ResumeSession, SessionMoved, SessionMovedError
from drift.wire.version import PROTOCOL_VERSION


class Following(Protocol):
    """What following a move needs of a session's Chain (drift.client.chain)."""

    spans: list[Any]  # SpanState: hop, socket, history
    client: Any  # RemoteClient: open_socket
    moves: int


log = logging.getLogger(__name__)
PEEK_S = 0.05  # how long a broken socket is read for a moved notice left on it


async def follow_move(session: Following, index: int, exc: DriftError, dtype_name: str) -> bool:
    """Span `index` resumed where its session moved; False when it did not move (or the
    resume failed: then the span fails over as usual)."""
    span = session.spans[index]
    moved = _moved(exc) or await _left_on(span.socket.ws)
    if moved is None:
        return False
    hop = dataclasses.replace(span.hop, addr=moved.addr, peer_id=moved.peer_id, compute=None)
    resume = ResumeSession(moved.session_id, moved.token, dtype_name)
    try:
        sock = await session.client.open_socket(hop, resume)
    except DriftError as err:
        log.info("could not resume the moved session at %s: %r; replaying", moved.peer_id, err)
        return False
    await span.socket.close()
    span.hop, span.socket = hop, sock
    session.moves += 1
    return True


def _moved(exc: DriftError) -> SessionMoved | None:
    if not isinstance(exc, SessionMovedError):
        return None
    d = exc.details
    return SessionMoved.from_wire({"type": MOVED, "version": PROTOCOL_VERSION, "addr": d.get("addr"),
                                   "peer_id": d.get("peer_id"), "token": d.get("token"),
                                   "session_id": d.get("session_id")})  # fmt: skip


async def _left_on(ws: aiohttp.ClientWebSocketResponse) -> SessionMoved | None:
    """A moved notice still unread on a socket that broke (the server left after telling)."""
    while True:
        try:
            msg = await ws.receive(timeout=PEEK_S)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ConnectionError):
            return None
        if msg.type == aiohttp.WSMsgType.BINARY:
            continue
        if msg.type != aiohttp.WSMsgType.TEXT:
            return None
        try:
            obj = orjson.loads(msg.data)
            if isinstance(obj, dict) and obj.get("type") == MOVED:
                return SessionMoved.from_wire(obj)
        except (orjson.JSONDecodeError, DriftError):
            return None
