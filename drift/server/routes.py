"""HTTP and WebSocket routes of a block server, added to the node's aiohttp app.

Each route parses (frame or plain JSON), calls one function of the backend or the session
manager, and serialises. A bad request or a vanished client never kills a session or the
node: errors become `{"error": {...}}` replies (HTTP) or `error` messages (WebSocket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import torch
from aiohttp import WSMsgType, web

from drift.node.app import NODE
from drift.node.body import AUTH_PROOF, read_body
from drift.server.backend import SpanBackend
from drift.server.handoff_route import add_handoff_route, resume
from drift.server.metrics import tokens_of
from drift.server.push_route import add_push_route
from drift.server.state import BlockServer
from drift.server.steps import serve_frame
from drift.wire.checks import ACTIVATION_DTYPES
from drift.wire.codec import Frame, encode, encode_text, read_text
from drift.wire.errors import BadRequest, Busy, DriftError, PayloadTooLarge
from drift.wire.extend import EXTEND, ExtendSession
from drift.wire.frames import MEDIA_TYPE
from drift.wire.handoff import RESUME
from drift.wire.messages import (
    BackwardRequest,
    CloseSession,
    ErrorMessage,
    ForwardRequest,
    IdleSession,
    OpenSession,
)
from drift.wire.progress import CALL_HEADER, COMPUTE_PATH, MAX_CALL_ID, ComputeStatus
from drift.wire.version import PROTOCOL_VERSION

log = logging.getLogger(__name__)
BLOCK_SERVER = web.AppKey("block_server", BlockServer)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Req = TypeVar("_Req", ForwardRequest, BackwardRequest)


def add_server_routes(app: web.Application, server: BlockServer) -> None:
    """Mount /blocks, /forward, /backward, /inference, /push, /compute and /metrics; own the
    reaper loop."""
    app[BLOCK_SERVER] = server
    app.router.add_get("/blocks", _counted(server, "/blocks", _blocks))
    app.router.add_post("/forward", _counted(server, "/forward", _forward))
    app.router.add_post("/backward", _counted(server, "/backward", _backward))
    app.router.add_get("/inference", _counted(server, "/inference", _inference))
    app.router.add_get("/metrics", _counted(server, "/metrics", _metrics))
    app.router.add_get(COMPUTE_PATH, _counted(server, COMPUTE_PATH, _compute_status))
    add_push_route(app, server)
    add_handoff_route(app, server)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_close_sockets)


def _counted(server: BlockServer, route: str, handler: Handler) -> Handler:
    """Count each request by status; errors go on to the node's one error middleware."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            response = await handler(request)
        except (DriftError, web.HTTPException) as exc:
            server.metrics.count(route, exc.status)
            raise
        except Exception:
            server.metrics.count(route, 500)
            raise
        server.metrics.count(route, response.status)
        return response

    return wrapped


async def _blocks(request: web.Request) -> web.Response:
    return web.json_response(request.app[BLOCK_SERVER].describe().to_wire())


async def _compute_status(request: web.Request) -> web.Response:
    """GET /compute[?session=ID | ?call=ID]: the compute thread now (drift.wire.progress),
    and whether session ID has a step here (queued or running), or the /forward or /backward
    call named ID is being served; an unknown ID has none."""
    server = request.app[BLOCK_SERVER]
    backend, session_id = server.backend, request.query.get("session", "")
    session = server.sessions.sessions.get(session_id) if session_id else None
    pending = (session is not None and session.lock.locked()) or (
        request.query.get("call", "") in server.calls
    )
    status = ComputeStatus(round(backend.executor.running_s(), 3), backend.executor.waiting,
                           backend.unit_s, pending)  # fmt: skip
    return web.json_response(status.to_wire())


async def _metrics(request: web.Request) -> web.Response:
    text = request.app[BLOCK_SERVER].metrics.render()
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def _forward(request: web.Request) -> web.Response:
    return await _compute(request, ForwardRequest, SpanBackend.forward)


async def _backward(request: web.Request) -> web.Response:
    return await _compute(request, BackwardRequest, SpanBackend.backward)


async def _compute(
    request: web.Request, kind: type[_Req], run: Callable[[SpanBackend, _Req], Awaitable[Any]]
) -> web.Response:
    """/forward and /backward: parse `kind` (frame or JSON), run it, time it, reply in kind.
    A call named by its CALL_HEADER counts as being served (GET /compute?call=) meanwhile."""
    server = request.app[BLOCK_SERVER]
    call = request.headers.get(CALL_HEADER, "")[:MAX_CALL_ID]
    if not call:
        return await _served(request, server, kind, run)
    server.calls.add(call)
    try:
        return await _served(request, server, kind, run)
    finally:
        server.calls.discard(call)


async def _served(
    request: web.Request, server: BlockServer, kind: type[_Req],
    run: Callable[[SpanBackend, _Req], Awaitable[Any]],
) -> web.Response:  # fmt: skip
    started = time.perf_counter()
    if request.content_type == "application/json":
        limit, name = server.config.max_json_bytes, "max_json_bytes (plain-JSON bodies)"
    else:
        limit, name = server.config.max_body_bytes, "max_body_bytes (--max_body_mb)"
    body, is_json = await _read_body(request, limit, name)
    backend, wire = server.backend, None
    if is_json:
        if len(body) > server.config.max_json_bytes:
            raise PayloadTooLarge(f"a plain-JSON body of {len(body)} bytes exceeds this server's "
                                  f"max_json_bytes={server.config.max_json_bytes}; send a tensor "
                                  "frame for larger inputs")  # fmt: skip
        req = kind.from_json(read_text(body)[1], default_model=backend.fingerprint,
                             hidden_size=backend.hidden_size,
                             extras=backend.extra_spec)  # fmt: skip
    else:
        frame = Frame.read(body)
        wire = frame.form  # the reply travels packed as the request
        req = frame.message(
            kind,
            ACTIVATION_DTYPES.get(backend.dtype_name, torch.float32),
            hidden_size=backend.hidden_size,
            extras=backend.extra_spec,
        )
    result = await run(backend, req)
    server.metrics.forward_latency.observe(time.perf_counter() - started)
    server.metrics.processed(tokens_of(req.hidden_states), req.end_block - req.start_block,
                             step=False)  # fmt: skip
    return _reply(result, is_json, wire)


def _reply(result: Any, is_json: bool, wire: str | None = None) -> web.Response:
    if is_json:
        return web.Response(body=orjson.dumps(result.to_json()), content_type="application/json")
    return web.Response(body=encode(result, wire), content_type=MEDIA_TYPE)


async def _read_body(request: web.Request, limit: int, name: str) -> tuple[bytes, bool]:
    """The body (zstd undone), refused past `limit` bytes before it is all read."""
    body = await read_body(request, limit, limit_name=name,
                           idle_timeout_s=request.app[NODE].config.idle_timeout_s)  # fmt: skip
    return body, _is_json(request.content_type, body)


def _is_json(content_type: str, body: bytes) -> bool:
    """JSON when declared so, or when a body not declared a frame is a JSON object: `curl -d`
    sends form-encoding by default, and a user trying a block should get the JSON route."""
    if content_type == "application/json":
        return True
    if content_type in (MEDIA_TYPE, "application/octet-stream"):
        return False
    return body.lstrip()[:1] == b"{"


async def _inference(request: web.Request) -> web.WebSocketResponse:
    """One WebSocket: open -> session_opened, binary steps -> binary replies, close. A socket
    that has opened no session is closed after the node's idle timeout, one whose session is
    silent after the session timeout (plus the idle timeout); a handshake proven with the swarm key opens one session."""
    server = request.app[BLOCK_SERVER]
    if len(server.sockets) >= server.config.max_sockets:
        raise Busy(f"this server has {len(server.sockets)} inference sockets open (limit "
                   f"max_sockets={server.config.max_sockets}); retry shortly")  # fmt: skip
    idle_s = request.app[NODE].config.idle_timeout_s
    ws = web.WebSocketResponse(max_msg_size=server.config.max_body_bytes)
    await ws.prepare(request)
    server.sockets.add(ws)
    bound = AUTH_PROOF.get() is not None
    # a socket that proved the swarm key is the private swarm's own: no per-client KV share
    state = _SocketState(bound=bound, client="" if bound else (request.remote or "?"))
    try:
        while not ws.closed:
            # a reaped session's next step still hears `unknown_session` before the socket goes
            timeout = idle_s + (0 if state.session_id is None else server.config.session_timeout_s)
            try:
                msg = await ws.receive(timeout=timeout)
            except asyncio.TimeoutError:
                if _pushed_lately(server, state.session_id, timeout):
                    continue  # its steps come pushed by another server
                await ws.close(code=1001, message=b"idle")
                break
            if msg.type == WSMsgType.TEXT:
                await _on_text(server, ws, state, msg.data)
            elif msg.type == WSMsgType.BINARY:
                await serve_frame(server, request.app[NODE], ws, state.session_id, msg.data)
            else:  # CLOSE, CLOSING, CLOSED, ERROR
                break
    finally:
        server.sockets.discard(ws)
        if state.session_id is not None:
            server.sessions.close(state.session_id)
    return ws


def _pushed_lately(server: BlockServer, session_id: str | None, within_s: float) -> bool:
    session = None if session_id is None else server.sessions.sessions.get(session_id)
    return session is not None and time.monotonic() - session.last_used < within_s


@dataclass
class _SocketState:
    bound: bool  # the handshake proved the swarm key: it opens one session, not a stream
    client: str  # who opened the socket (its address): its share of the KV budget is bounded
    session_id: str | None = None
    opened: int = 0  # sessions opened on this socket


async def _on_text(server: BlockServer, ws: web.WebSocketResponse, state: _SocketState,
                   data: str) -> None:  # fmt: skip
    try:
        kind, obj = read_text(data)
        if kind == "open":
            req = OpenSession.from_wire(obj)
            if state.session_id is not None:
                raise BadRequest("this socket already has a session; close it first")
            if state.bound and state.opened:
                raise BadRequest("this socket's handshake was proven for one session; "
                                 "open a new socket for the next one")  # fmt: skip
            session, opened = await server.sessions.open(req, ws, state.client)
            state.session_id, state.opened = session.session_id, state.opened + 1
            await _send(ws, opened.to_wire())
            return
        if kind == RESUME:  # a session handed over to this server (drift.server.handoff)
            if state.session_id is not None or state.opened:
                raise BadRequest("resume a session on a new socket")
            opened = resume(server, obj, ws)
            state.session_id, state.opened = opened.session_id, state.opened + 1
            await _send(ws, opened.to_wire())
            return
        if kind == EXTEND:
            grow = ExtendSession.from_wire(obj)
            if state.session_id is None:
                raise BadRequest("no session is open on this socket: send 'open' first")
            await _send(ws, server.sessions.extend(state.session_id, grow.max_length).to_wire())
            return
        if kind == "idle":  # no reply
            IdleSession.from_wire(obj)
            if state.session_id is not None:
                server.sessions.idle(state.session_id)
            return
        if kind == "close":
            CloseSession.from_wire(obj)
            if state.session_id is not None:
                server.sessions.close(state.session_id)
                state.session_id = None
            await _send(ws, {"type": "session_closed", "version": PROTOCOL_VERSION})
            return
        raise BadRequest(
            f"unexpected text message of type {kind!r}: send 'open', 'extend', 'idle' or "
            "'close' as JSON and steps as binary tensor frames"
        )
    except DriftError as exc:
        server.metrics.count("/inference:open", exc.status)
        await _send(ws, ErrorMessage(exc.code, exc.message).to_wire())


async def _send(ws: web.WebSocketResponse, obj: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(encode_text(obj))


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """The reaper (idle sessions) and announcer (cache left) loop, and cleanup at exit."""
    server = app[BLOCK_SERVER]
    task = asyncio.create_task(server.housekeeping_loop())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    server.runtime.close()


async def _close_sockets(app: web.Application) -> None:
    for ws in list(app[BLOCK_SERVER].sockets):
        await ws.close(code=1001, message=b"server shutdown")
