"""One inference step on a session, from its client's socket or pushed by another server.

Validated once here, against the session's limits; run under the session's lock; the reply
goes to the session's client socket. A step naming `next` hops (drift.wire.push) goes on to
the first of them once computed, before the reply, which says whether it did.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson
import torch
from aiohttp import web

from drift.node.membership import MembershipNode
from drift.server.metrics import tokens_of
from drift.server.push import check_member, forward_error
from drift.wire.compress import WIRE_DTYPE, check_form, pack, unpack
from drift.wire.errors import BadRequest, DriftError
from drift.wire.frames import decode_frame, encode_frame
from drift.wire.messages import ErrorMessage, StepRequest, StepResponse
from drift.wire.push import PUSH_ERROR, PUSHED, NextHop, onward_params, parse_next

if TYPE_CHECKING:
    from drift.server.state import BlockServer

log = logging.getLogger(__name__)
Tensors = dict[str, Any]


async def serve_frame(server: BlockServer, node: MembershipNode, ws: web.WebSocketResponse,
                      session_id: str | None, data: bytes) -> None:  # fmt: skip
    """A binary step frame from the session's own socket."""
    try:
        params, tensors = decode_frame(data)
    except DriftError as exc:
        server.metrics.count("/inference:step", exc.status)
        await _send_str(ws, ErrorMessage(exc.code, exc.message).to_wire())
        return
    await serve_step(server, node, ws, session_id, params, tensors)


async def serve_step(
    server: BlockServer, node: MembershipNode, ws: web.WebSocketResponse,
    session_id: str | None, params: dict[str, Any], tensors: Tensors, *, pushed: bool = False,
) -> None:  # fmt: skip
    """Run one step and reply on `ws` (the session's client socket); `pushed`: it came from
    another server (dropped when the session already ran a newer step)."""
    started = time.perf_counter()
    step_id = params.get("step_id") if isinstance(params.get("step_id"), int) else None
    if await server.handoff.answer_moved(ws, session_id, step_id):  # handoff hook
        return
    try:
        # validated once, here, against the session's limits; the session and span trust it
        limits = None if session_id is None else server.sessions.get(session_id).limits
        wire = check_form(params.get(WIRE_DTYPE))
        tensors = unpack(params, tensors, (limits and limits.dtype) or torch.float32)
        req = StepRequest.from_wire(params, tensors, limits=limits,
                                    hidden_size=server.backend.hidden_size)  # fmt: skip
        if session_id is None:
            raise BadRequest("no session is open on this socket: send 'open' first")
        hops = parse_next(params)
        if hops:
            check_member(node, hops[0])
        if hops and (req.extras or req.donate or req.block_states or req.prompts is not None):
            raise BadRequest("a step carrying extras, deep prompts or asking for K/V or block "
                             "states cannot be pushed: the client routes those")  # fmt: skip
        async with server.push.lock(session_id):
            if not server.push.admit(session_id, req.step_id, pushed=pushed):
                return
            reply = await server.sessions.step(session_id, req)
    except DriftError as exc:
        server.metrics.count("/inference:step", exc.status)
        await _send_str(ws, ErrorMessage(exc.code, exc.message, step_id).to_wire())
        return
    except Exception:
        log.exception("inference step failed")
        server.metrics.count("/inference:step", 500)
        await _send_str(
            ws, ErrorMessage("internal", "the step failed on the server", step_id).to_wire()
        )
        return
    out_params, out_tensors = reply.to_wire()
    out_tensors = pack(out_params, out_tensors, wire)
    if hops:
        out_params.update(await _forward(server, node, params, tensors, reply, hops, wire))
    server.metrics.count("/inference:step", 200)
    server.metrics.step_latency.observe(time.perf_counter() - started)
    opened = server.sessions.sessions.get(session_id)
    blocks = opened.request.end_block - opened.request.start_block if opened is not None else 0
    server.metrics.processed(tokens_of(req.hidden_states), blocks, step=True)
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client may be gone
        await ws.send_bytes(encode_frame(out_params, out_tensors))


async def _forward(server: BlockServer, node: MembershipNode, params: dict[str, Any],
                   tensors: Tensors, reply: StepResponse,
                   hops: tuple[NextHop, ...], wire: str | None) -> dict[str, Any]:  # fmt: skip
    """Push the step's output on to hops[0] (packed as the step came); the reply params
    saying how it went."""
    onward = onward_params(params, hops)
    frame = encode_frame(onward, pack(onward, dict(tensors, hidden_states=reply.hidden_states),
                                      wire))  # fmt: skip
    try:
        await server.push.links.send(node, hops[0], frame)
    except Exception as exc:  # noqa: BLE001 -- any failure: the client relays instead
        log.info("push failed: %s", forward_error(hops[0], exc))
        return {PUSH_ERROR: forward_error(hops[0], exc)}
    return {PUSHED: True}


async def _send_str(ws: web.WebSocketResponse, obj: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(orjson.dumps(obj).decode())
