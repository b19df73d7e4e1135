"""Draining a server: each live session's KV cache handed to a replacement, no replay.

`drain` stops new sessions, announces `draining` (an optional record field: older peers
keep reading the record as online), and for each live session picks servers covering its
blocks (`replacements`, like a failover target), snapshots the session between two of its
steps (under its step lock) and streams it to the first that takes it (drift.wire.handoff,
over the replacement's /handoff WebSocket, swarm-key authenticated, the offer signed with
this server's identity, bounded in time). The client is told `session_moved`; a session no
one takes stays here and its client replays elsewhere when this server stops, as today.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import torch
from aiohttp import WSMsgType, web
from transformers.cache_utils import CacheLayerMixin, DummyLayer

from drift.node.membership import MembershipNode
from drift.server.sessions import Session
from drift.swarm.dial import peer_ssl
from drift.swarm.record import PeerRecord
from drift.waits import wait_for
from drift.wire.auth import auth_headers
from drift.wire.checks import dtype_name
from drift.wire.errors import DriftError, PeerUnavailable, from_payload
from drift.wire.frames import encode_frame
from drift.wire.handoff import (
    ACCEPTED,
    HandoffAccepted,
    HandoffOffer,
    HandoffPiece,
    LayerKV,
    SessionMoved,
)

if TYPE_CHECKING:
    from drift.server.state import BlockServer

log = logging.getLogger(__name__)
HANDOFF_PATH = "/handoff"
READY = "handoff_ready"  # the receiver reserved room: the pieces may come
PIECE_BYTES = 4 << 20  # bytes of K+V in one piece (well under any server's max_body_bytes)
SESSION_HANDOFF_S = 30.0  # at most this long for one session's transfer (within the drain)
PARALLEL = 4  # sessions handed over at once


def replacements(records: list[PeerRecord], me: str, fingerprint: str, start: int, end: int,
                 needed: int) -> list[PeerRecord]:  # fmt: skip
    """Live servers other than `me` serving the same model over all of [start, end) with
    `needed` tokens of cache left per block, not draining; the fastest first."""
    fit = [r for r in records
           if r.peer_id != me and r.model_fingerprint == fingerprint and r.addrs
           and all(r.serves(b) for b in (start, end - 1)) and r.cache_tokens_left >= needed]  # fmt: skip
    return sorted(fit, key=lambda r: -r.throughput)


async def drain(server: BlockServer, node: MembershipNode, timeout_s: float) -> None:
    """Hand every live session over within `timeout_s`, then wait (in that bound) for the
    moved sessions' clients to leave. Cancelled (a second Ctrl+C): stops at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    hub = server.handoff
    hub.draining = True
    server.sessions.refusing = (
        "this server is draining (leaving the swarm); open the session elsewhere"
    )
    with contextlib.suppress(Exception):
        node.announce(draining=1)
    live = await hand_over_all(server, node, deadline)
    while loop.time() < deadline and not all(ws.closed for ws in hub.left_open.values()):
        await asyncio.sleep(0.05)
    log.info("drained: %d of %d session(s) handed over", len(hub.moved), live)


async def hand_over_all(server: BlockServer, node: MembershipNode, deadline: float) -> int:
    """Each live session to a replacement (PARALLEL at a time) by `deadline` (loop time):
    a drain's work, and a span move's before it waits for what stays; how many were live."""
    limit = asyncio.Semaphore(PARALLEL)

    async def one(session: Session) -> None:
        async with limit:
            await hand_over(server, node, session, deadline)

    live = list(server.sessions.sessions.values())
    if live:
        log.info("handing %d session(s) over", len(live))
        await asyncio.gather(*(one(s) for s in live))
    return len(live)


async def hand_over(server: BlockServer, node: MembershipNode, session: Session,
                    deadline: float) -> bool:  # fmt: skip
    """`session` to the first replacement that takes it; whether one did."""
    sid, req = session.session_id, session.request
    if session.lora or session.cache.position == 0:
        return False  # a client's own LoRA weights stay with it; nothing held: nothing to move
    hub = server.handoff
    candidates = replacements(node.table.live(node.clock()), node.peer_id,
                              server.backend.fingerprint, req.start_block, req.end_block,
                              req.max_length * req.batch_size)  # fmt: skip
    # only proven addresses are dialled; one gossip has not proven yet is proven now
    candidates = [
        r
        for r in candidates
        if node.admission.is_proven(r.peer_id, r.addrs[0]) or await node.prove_now(r)
    ]
    if not candidates:
        log.info("no server can take session %s over [%d, %d): its client will replay",
                 sid, req.start_block, req.end_block)  # fmt: skip
        return False
    hub.pending[sid] = event = asyncio.Event()
    try:
        async with session.lock:  # a step already under way finishes first
            offer, pieces = await server.backend.run(_snapshot, session, node.peer_id)
        for record in candidates:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                accepted = await wait_for(
                    _transfer(node, record, offer, pieces), min(left, SESSION_HANDOFF_S)
                )
            except (DriftError, aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                log.info("handoff of session %s to %s failed: %r", sid, record.peer_id, exc)
                continue
            moved = SessionMoved(record.addrs[0], record.peer_id, accepted.session_id,
                                 accepted.token)  # fmt: skip
            hub.moved[sid] = moved
            ws = session.socket
            if ws is not None:  # told now: an idle client reads it with its next step
                hub.left_open[sid] = ws
                await _send(ws, moved.to_wire())
            server.sessions.close(sid)  # the cache lives there now
            log.info("session %s handed to %s (%d bytes of K/V)", sid, record.peer_id,
                     offer.kv_bytes())  # fmt: skip
            return True
        return False
    finally:
        event.set()
        hub.pending.pop(sid, None)


def _snapshot(session: Session, sender: str) -> tuple[HandoffOffer, list[HandoffPiece]]:
    """On the compute thread: the offer (unsigned, no target yet) and the K/V pieces."""
    span_session, req = session.cache, session.request
    layers: list[LayerKV] = []
    pieces: list[HandoffPiece] = []
    kv_dtype = None
    for block, layer in enumerate(span_session.cache.layers):
        if isinstance(layer, DummyLayer) or not isinstance(layer, CacheLayerMixin):
            continue
        keys, values = layer.keys, layer.values
        if not layer.is_initialized or keys is None or values is None or keys.numel() == 0:
            continue
        keys, values = keys.to("cpu"), values.to("cpu")  # [B, kv_heads, T, head_dim]
        kv_dtype = dtype_name(keys.dtype)
        cum = getattr(layer, "cumulative_length", None)
        shape = (int(keys.shape[0]), int(keys.shape[1]), int(keys.shape[2]), int(keys.shape[3]))
        layers.append(LayerKV(block, shape, None if cum is None else int(cum)))
        per_token = 2 * keys.element_size() * shape[0] * shape[1] * shape[3]
        step = max(1, PIECE_BYTES // per_token)
        for t0 in range(0, shape[2], step):
            pieces.append(HandoffPiece(len(pieces), block, t0, keys[:, :, t0 : t0 + step],
                                       values[:, :, t0 : t0 + step]))  # fmt: skip
    mask = span_session.mask.to("cpu", torch.bool)
    pieces[0] = replace(pieces[0], mask=mask)
    offer = HandoffOffer(sender, "", "", 0.0, req.model, req.start_block, req.end_block,
                         span_session.position, req.max_length, req.batch_size, req.dtype,
                         kv_dtype or "float32", req.adapter, tuple(layers), len(pieces))  # fmt: skip
    return offer, pieces


def sign_offer(node: MembershipNode, offer: HandoffOffer, target: str) -> HandoffOffer:
    offer = replace(offer, target=target, nonce=secrets.token_hex(16), issued_at=time.time())
    signature = node.identity.sign(offer.signed_bytes())
    return replace(offer, signature=base64.b64encode(signature).decode("ascii"))


async def _transfer(node: MembershipNode, record: PeerRecord, offer: HandoffOffer,
                    pieces: list[HandoffPiece]) -> HandoffAccepted:  # fmt: skip
    """Offer, pieces, and the receiver's acceptance over one WebSocket to its /handoff."""
    if node.http is None:
        raise PeerUnavailable("this node is not running")
    addr, peer = record.addrs[0], record.peer_id
    headers = auth_headers(node.config.swarm_key, "GET", HANDOFF_PATH, peer_id=peer)
    async with node.http.ws_connect(f"{addr}{HANDOFF_PATH}", headers=headers, max_msg_size=0,
                                    ssl=peer_ssl(peer)) as ws:  # fmt: skip
        await ws.send_str(orjson.dumps(sign_offer(node, offer, peer).to_wire()).decode())
        _expect(await ws.receive(), READY, peer)
        for piece in pieces:
            await ws.send_bytes(encode_frame(*piece.to_wire()))
        return HandoffAccepted.from_wire(_expect(await ws.receive(), ACCEPTED, peer))


def _expect(msg: aiohttp.WSMessage, kind: str, peer: str) -> dict[str, Any]:
    if msg.type != WSMsgType.TEXT:
        raise PeerUnavailable(f"{peer} closed the handoff socket ({msg.type.name})")
    obj = orjson.loads(msg.data)
    if isinstance(obj, dict) and obj.get("type") == "error":
        raise from_payload({"error": obj}, 500)
    if not isinstance(obj, dict) or obj.get("type") != kind:
        raise PeerUnavailable(f"{peer} answered a handoff with {str(obj)[:200]}")
    return obj


async def _send(ws: web.WebSocketResponse, obj: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(orjson.dumps(obj).decode())
