"""One inference step on a session, from its client's socket or pushed by another server.

Validated once here, against the session's limits; run under the session's lock; the reply
goes to the session's client socket. A step naming `next` hops (drift.wire.push) goes on to
the first of them once computed, before the reply, which says whether it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import torch
from aiohttp import web

from drift.node.membership import MembershipNode
from drift.server.metrics import tokens_of
from drift.server.push import check_member, forward_error
from drift.wire.codec import Frame, encode, encode_text
from drift.wire.errors import BadRequest, DriftError
from drift.wire.messages import ErrorMessage
from drift.wire.step import StepRequest, StepResponse

if TYPE_CHECKING:
    from drift.server.state import BlockServer

log = logging.getLogger(__name__)


async def serve_frame(server: BlockServer, node: MembershipNode, ws: web.WebSocketResponse,
                      session_id: str | None, data: bytes) -> None:  # fmt: skip
    """A binary step frame from the session's own socket."""
    try:
        frame = Frame.read(data)
    except DriftError as exc:
        server.metrics.count("/inference:step", exc.status)
        await _send_str(ws, ErrorMessage(exc.code, exc.message))
        return
    await serve_step(server, node, ws, session_id, frame)


async def serve_step(
    server: BlockServer, node: MembershipNode, ws: web.WebSocketResponse,
    session_id: str | None, frame: Frame, *, pushed: bool = False,
) -> None:  # fmt: skip
    """Run one step and reply on `ws` (the session's client socket); `pushed`: it came from
    another server (dropped when the session already ran a newer step)."""
    started = time.perf_counter()
    if await server.handoff.answer_moved(ws, session_id, frame.step_id):
        return  # handoff hook: the session lives elsewhere now
    try:
        # validated once, here, against the session's limits; the session and span trust it
        session = None if session_id is None else server.sessions.get(session_id)
        limits = None if session is None else session.limits
        req = frame.message(StepRequest, (limits and limits.dtype) or torch.float32,
                            limits=limits, hidden_size=server.backend.hidden_size)  # fmt: skip
        if session is None:
            raise BadRequest("no session is open on this socket: send 'open' first")
        if req.next_hops:
            check_member(node, req.next_hops[0])
        async with session.lock:
            if not session.admit(req.step_id, pushed=pushed):
                return
            reply = await server.sessions.step(session.session_id, req)
    except DriftError as exc:
        server.metrics.count("/inference:step", exc.status)
        await _send_str(ws, ErrorMessage(exc.code, exc.message, frame.step_id))
        return
    except Exception:
        log.exception("inference step failed")
        server.metrics.count("/inference:step", 500)
        await _send_str(ws, ErrorMessage("internal", "the step failed on the server",
                                         frame.step_id))  # fmt: skip
        return
    if req.next_hops:
        reply = await _forward(server, node, req, reply, frame.form)
    server.metrics.count("/inference:step", 200)
    server.metrics.step_latency.observe(time.perf_counter() - started)
    server.metrics.processed(tokens_of(req.hidden_states), session.n_blocks, step=True)
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client may be gone
        await ws.send_bytes(encode(reply, frame.form))


async def _forward(server: BlockServer, node: MembershipNode, req: StepRequest,
                   reply: StepResponse, wire: str | None) -> StepResponse:  # fmt: skip
    """Push the step's output on to its first next hop (packed as the step came); the reply,
    saying how it went."""
    hop = req.next_hops[0]
    try:
        await server.links.send(node, hop, encode(req.onward(reply.hidden_states), wire))
    except Exception as exc:  # noqa: BLE001 -- any failure: the client relays instead
        log.info("push failed: %s", forward_error(hop, exc))
        return dataclasses.replace(reply, push_error=forward_error(hop, exc))
    return dataclasses.replace(reply, pushed=True)


async def _send_str(ws: web.WebSocketResponse, message: ErrorMessage) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(encode_text(message))
