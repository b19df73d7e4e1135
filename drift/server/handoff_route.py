"""Taking a handed-over session: the /handoff WebSocket and `resume` on /inference.

A draining member sends a signed offer (drift.wire.handoff): it is taken only from a live
member of this server's table (its identity signature checked, fresh, never replayed), for
the model and blocks served here, within the KV budget (reserved like an `open`); then the
K/V pieces, in order, each checked against the offer, within a time bound. The session is
parked until its client sends `resume` with the token (closed if none does within
PARK_TIMEOUT_S).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from typing import TYPE_CHECKING

import orjson
import torch
from aiohttp import WSMsgType, web
from transformers.cache_utils import CacheLayerMixin, DummyLayer

from drift.identity import verify_signature
from drift.node.app import NODE
from drift.node.membership import MembershipNode
from drift.server.handoff import HANDOFF_PATH, READY
from drift.wire.errors import BadRequest, Busy, DriftError, Forbidden, UnknownSession
from drift.wire.frames import decode_frame
from drift.wire.handoff import (
    KV_DTYPES,
    HandoffAccepted,
    HandoffOffer,
    HandoffPiece,
    ResumeSession,
)
from drift.wire.messages import ErrorMessage, OpenSession, SessionOpened

if TYPE_CHECKING:
    from drift.server.sessions import Session
    from drift.server.state import BlockServer

log = logging.getLogger(__name__)
OFFER_AGE_S = 60.0  # an offer issued longer ago (or that far ahead) is refused
MESSAGE_S = 30.0  # the most a handoff socket waits for the offer or its next piece


def add_handoff_route(app: web.Application, server: BlockServer) -> None:
    app.router.add_get(HANDOFF_PATH, functools.partial(_handoff_socket, server))


async def _handoff_socket(server: BlockServer, request: web.Request) -> web.WebSocketResponse:
    if len(server.sockets) >= server.config.max_sockets:
        raise Busy(f"this server has {len(server.sockets)} sockets open; retry shortly")
    ws = web.WebSocketResponse(max_msg_size=server.config.max_body_bytes)
    await ws.prepare(request)
    server.sockets.add(ws)
    try:
        accepted = await _receive(server, request.app[NODE], ws)
        await ws.send_str(orjson.dumps(accepted.to_wire()).decode())
    except DriftError as exc:
        server.metrics.count(HANDOFF_PATH, exc.status)
        await ws.send_str(orjson.dumps(ErrorMessage(exc.code, exc.message).to_wire()).decode())
    except (asyncio.TimeoutError, ConnectionError):
        server.metrics.count(HANDOFF_PATH, 408)
    finally:
        server.sockets.discard(ws)
        await ws.close()
    return ws


async def _next(ws: web.WebSocketResponse, kind: WSMsgType) -> str | bytes:
    msg = await ws.receive(timeout=MESSAGE_S)
    if msg.type != kind:
        raise BadRequest(f"the handoff expected a {kind.name} message, got {msg.type.name}")
    return msg.data  # type: ignore[no-any-return]


async def _receive(server: BlockServer, node: MembershipNode,
                   ws: web.WebSocketResponse) -> HandoffAccepted:  # fmt: skip
    try:
        offer = HandoffOffer.from_wire(orjson.loads(await _next(ws, WSMsgType.TEXT)))
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the handoff offer is not JSON: {exc}") from exc
    check_offer(server, node, offer)
    opened = OpenSession(offer.model, offer.start_block, offer.end_block, offer.max_length,
                         offer.batch_size, offer.dtype, offer.adapter)  # fmt: skip
    session, _ = await server.sessions.open(opened)  # the budget, span and adapter checks
    try:
        await ws.send_str(orjson.dumps({"type": READY}).decode())
        keys, values, mask = _empty(offer)
        filled = {x.block: 0 for x in offer.layers}
        for index in range(offer.pieces):
            params, tensors = decode_frame(await _next(ws, WSMsgType.BINARY))  # type: ignore[arg-type]
            piece = HandoffPiece.from_wire(params, tensors, offer)
            if piece.index != index or piece.t0 != filled[piece.block]:
                raise BadRequest(f"handoff piece {piece.index} (block {piece.block}, token "
                                 f"{piece.t0}) out of order")  # fmt: skip
            t1 = piece.t0 + piece.keys.shape[2]
            keys[piece.block][:, :, piece.t0 : t1] = piece.keys
            values[piece.block][:, :, piece.t0 : t1] = piece.values
            filled[piece.block], mask = t1, piece.mask if piece.mask is not None else mask
        short = [x.block for x in offer.layers if filled[x.block] != x.shape[2]]
        if short or mask is None:
            raise BadRequest(f"the handoff ended with blocks {short} incomplete")
        await server.backend.run(_install, session, offer, keys, values, mask)
    except BaseException:
        server.sessions.close(session.session_id)
        raise
    token = secrets.token_hex(16)
    server.handoff.park(session.session_id, token, time.monotonic())
    log.info("took session over from %s: blocks [%d, %d), %d tokens", offer.sender,
             offer.start_block, offer.end_block, offer.position)  # fmt: skip
    return HandoffAccepted(session.session_id, token)


def check_offer(server: BlockServer, node: MembershipNode, offer: HandoffOffer) -> None:
    """Forbidden unless the offer is for us, fresh, new, and signed by a live member."""
    if server.handoff.draining:
        raise Busy("this server is draining too; it takes no sessions")
    if offer.target != node.peer_id:
        raise Forbidden(f"this handoff offer is for {offer.target}, not {node.peer_id}")
    if abs(time.time() - offer.issued_at) > OFFER_AGE_S:
        raise Forbidden("this handoff offer is stale (or its clock is far off)")
    if not node.table.is_live(offer.sender, node.clock()):
        raise Forbidden(f"will not take a session from {offer.sender}: it is not a live member "
                        "of this server's swarm table")  # fmt: skip
    if not verify_signature(offer.sender, offer.signed_bytes(), offer.signature_bytes()):
        raise Forbidden(f"the handoff offer's signature is not {offer.sender}'s")
    if offer.nonce in server.handoff.nonces:
        raise Forbidden("this handoff offer was already used")
    server.handoff.nonces.add(offer.nonce)


def _empty(offer: HandoffOffer) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], None]:
    dtype = KV_DTYPES[offer.kv_dtype]
    keys = {x.block: torch.empty(x.shape, dtype=dtype) for x in offer.layers}
    values = {x.block: torch.empty(x.shape, dtype=dtype) for x in offer.layers}
    return keys, values, None


def _install(session: Session, offer: HandoffOffer, keys: dict[int, torch.Tensor],
             values: dict[int, torch.Tensor], mask: torch.Tensor) -> None:  # fmt: skip
    """On the compute thread: the received K/V into the new session's cache."""
    span_session = session.cache
    device, dtype = span_session.span.device, span_session.span.dtype
    n_layers = len(span_session.cache.layers)
    if any(x.block >= n_layers for x in offer.layers):
        raise BadRequest(f"handoff layers outside the model's {n_layers} cache layers")
    for x in offer.layers:
        layer = span_session.cache.layers[x.block]
        if isinstance(layer, DummyLayer) or not isinstance(layer, CacheLayerMixin):
            raise BadRequest(f"handoff layer {x.block} is not one a session over "
                             f"[{offer.start_block}, {offer.end_block}) holds here")  # fmt: skip
        k, v = keys[x.block].to(device, dtype), values[x.block].to(device, dtype)
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        if x.cumulative is not None:
            layer.cumulative_length = x.cumulative
    span_session.mask = mask.to(device, torch.bool)
    span_session.position = offer.position


def resume(server: BlockServer, obj: object, ws: web.WebSocketResponse) -> SessionOpened:
    """`resume` on an inference socket: the parked session it names, with its token."""
    req = ResumeSession.from_wire(obj)
    token = server.handoff.parked.get(req.session_id)
    if token is None or not secrets.compare_digest(token, req.token):
        raise UnknownSession(f"no handed-over session {req.session_id} waits here")
    session = server.sessions.get(req.session_id)
    server.handoff.unpark(req.session_id)
    session.last_used, session.socket = time.monotonic(), ws
    return SessionOpened(req.session_id, session.request.max_length, session.push_token,
                         idles=True)  # fmt: skip
