"""The /push WebSocket: links other servers push a client's steps into (drift.server.push).

Each binary frame names the session it is for and carries that session's push token
(drift.wire.push); one without the right token is refused on the link, before it touches the
session (counted as `/push:step` 403 on /metrics). An accepted one runs through `serve_step`
as if the session's client had sent it, and the reply goes to that client's socket. Counted
against the server's `max_sockets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from drift.node.app import NODE
from drift.node.membership import MembershipNode
from drift.server.push import PUSH_PATH
from drift.server.steps import serve_step
from drift.wire.codec import Frame, encode_text
from drift.wire.errors import BadRequest, Busy, DriftError
from drift.wire.messages import ErrorMessage
from drift.wire.push import forbidden

if TYPE_CHECKING:
    from drift.server.state import BlockServer


def add_push_route(app: web.Application, server: BlockServer) -> None:
    """Mount /push (incoming links) and close the outgoing links at shutdown."""
    app.router.add_get(PUSH_PATH, functools.partial(_push_socket, server))

    async def _close_links(app: web.Application) -> None:
        await server.links.close()

    app.on_shutdown.append(_close_links)


async def _push_socket(server: BlockServer, request: web.Request) -> web.WebSocketResponse:
    """One link from another server: binary pushed steps in; errors about steps it cannot
    place (an unknown session) go back as text. Counted against max_sockets."""
    if len(server.sockets) >= server.config.max_sockets:
        raise Busy(f"this server has {len(server.sockets)} sockets open (limit "
                   f"max_sockets={server.config.max_sockets}); retry shortly")  # fmt: skip
    node = request.app[NODE]
    ws = web.WebSocketResponse(max_msg_size=server.config.max_body_bytes)
    await ws.prepare(request)
    server.sockets.add(ws)
    running: set[asyncio.Task[None]] = set()
    timeout = node.config.idle_timeout_s + server.config.session_timeout_s
    try:
        while not ws.closed:
            try:
                msg = await ws.receive(timeout=timeout)
            except asyncio.TimeoutError:
                await ws.close(code=1001, message=b"idle")
                break
            if msg.type == WSMsgType.BINARY:
                task = asyncio.create_task(_pushed(server, node, ws, msg.data))
                running.add(task)
                task.add_done_callback(running.discard)
            elif msg.type == WSMsgType.TEXT:
                await _say(ws, BadRequest("a push link carries binary step frames only"))
            else:
                break
    finally:
        server.sockets.discard(ws)
    return ws


async def _pushed(server: BlockServer, node: MembershipNode, link: web.WebSocketResponse,
                  data: bytes) -> None:  # fmt: skip
    try:
        frame = Frame.read(data)
        target = frame.push_target()
        session = server.sessions.sessions.get(target.session_id)
        client = None if session is None else session.socket
        if session is None or client is None:
            raise forbidden(target.session_id)
        target.check(session.push_token)
    except DriftError as exc:
        server.metrics.count("/push:step", exc.status)
        await _say(link, exc)
        return
    await serve_step(server, node, client, target.session_id, frame, pushed=True)


async def _say(ws: web.WebSocketResponse, exc: DriftError) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(encode_text(ErrorMessage(exc.code, exc.message)))
