"""One request, one reply to one server: POST /forward, POST /backward, GET /compute.

Requests and replies are the typed messages of drift.wire, sent as tensor frames (the body
maybe zstd-compressed, signed with the swarm key); every call has a timeout from
ClientConfig; server errors come back as the DriftError they name, and a peer that cannot be
reached raises PeerUnavailable. No routing, no retries here (drift.client.remote).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import torch

from drift.client.config import ClientConfig
from drift.client.routing import Hop
from drift.swarm.dial import peer_ssl
from drift.wire import codec
from drift.wire import messages as m
from drift.wire.auth import auth_headers, check_reply
from drift.wire.errors import DriftError, PeerUnavailable, from_payload
from drift.wire.frames import MEDIA_TYPE
from drift.wire.progress import CALL_HEADER, COMPUTE_PATH, ComputeStatus

_RETRYABLE_CODES = {"peer_unavailable", "busy", "cache_full", "internal", "unknown_session"}


def is_retryable(exc: BaseException) -> bool:
    """Errors another server (or a later try) may not have: network faults and 5xx-ish codes."""
    if isinstance(exc, DriftError):
        return exc.code in _RETRYABLE_CODES or exc.status >= 500
    return isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | ConnectionError)


def _timeout(config: ClientConfig, total_s: float | None = None) -> aiohttp.ClientTimeout:
    total = config.request_timeout_s if total_s is None else total_s
    return aiohttp.ClientTimeout(total=total, connect=config.connect_timeout_s)


async def _raise_for_reply(resp: aiohttp.ClientResponse, hop: Hop) -> None:
    if resp.status == 200:
        return
    body = await resp.read()
    try:
        payload: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    err = from_payload(payload, resp.status)
    err.details.setdefault("peer_id", hop.peer_id)
    raise err


def _body(message: Any, config: ClientConfig, path: str,
          peer_id: str) -> tuple[bytes, dict[str, str]]:  # fmt: skip
    """The (maybe zstd) body and its headers; the swarm-key HMAC covers the plain frame,
    which is what the server reads (aiohttp undoes Content-Encoding)."""
    frame = codec.encode(message, config.wire_dtype)
    proof = auth_headers(config.swarm_key, "POST", path, frame, peer_id=peer_id)
    data, encoding = codec.compress_body(frame, config.compress_min_bytes)
    return data, {"Content-Type": MEDIA_TYPE, **proof, **encoding}


async def post_frame(
    http: aiohttp.ClientSession,
    hop: Hop,
    route: str,
    message: Any,
    reply_cls: Any,
    config: ClientConfig,
    timeout_s: float | None = None,
    call_id: str | None = None,
    **expect: Any,
) -> Any:
    """POST `message` as a frame; the reply within `timeout_s` (default:
    config.request_timeout_s), decoded as `reply_cls` (expect: its from_wire's keyword checks,
    e.g. the blocks whose K/V were asked back); `call_id` names the call for GET /compute."""
    data, headers = _body(message, config, f"/{route}", hop.peer_id)
    if call_id:
        headers[CALL_HEADER] = call_id
    body = await _request(http, "POST", hop, f"/{route}", headers, config, timeout_s, data)
    return codec.decode(reply_cls, body, message.hidden_states.dtype, **expect)


async def _request(http: aiohttp.ClientSession, method: str, hop: Hop, path: str,
                   headers: dict[str, str], config: ClientConfig, timeout_s: float | None,
                   data: bytes | None = None) -> bytes:  # fmt: skip
    """The body of a 200 reply, its swarm-key signature checked; a server's error as the
    DriftError it names; PeerUnavailable if the peer cannot be reached in time."""
    try:
        async with http.request(method, f"{hop.addr}{path}", data=data, headers=headers,
                                timeout=_timeout(config, timeout_s),
                                ssl=peer_ssl(hop.peer_id)) as resp:  # fmt: skip
            await _raise_for_reply(resp, hop)
            body = await resp.read()
            check_reply(config.swarm_key, headers, resp.status, resp.headers, body,
                        what=f"{hop.peer_id} at {hop.addr}")  # fmt: skip
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise PeerUnavailable(f"{hop.peer_id} at {hop.addr}: {exc!r}", peer_id=hop.peer_id) from exc
    return body


async def forward(
    http: aiohttp.ClientSession, hop: Hop, model: str, hidden: torch.Tensor,
    config: ClientConfig, *,
    attention_mask: torch.Tensor | None = None, prompts: torch.Tensor | None = None,
    extras: dict[str, torch.Tensor] | None = None, donate: tuple[int, ...] = (),
    states: bool = False, timeout_s: float | None = None, adapter: str | None = None,
    call_id: str | None = None,
) -> m.ForwardResponse:  # fmt: skip
    """`states`: the reply also carries each block's output (extras.BLOCK_STATES);
    `adapter`: a served LoRA adapter to apply."""
    req = m.ForwardRequest(model, hop.start_block, hop.end_block, hidden, attention_mask, prompts,
                           extras or {}, donate, states, adapter)  # fmt: skip
    n_states = hop.end_block - hop.start_block if states else 0
    return await post_frame(http, hop, "forward", req, m.ForwardResponse, config, timeout_s,
                            call_id, donate=donate, states=n_states)  # fmt: skip


async def backward(
    http: aiohttp.ClientSession, hop: Hop, model: str, hidden: torch.Tensor,
    grad_outputs: torch.Tensor, config: ClientConfig, *,
    attention_mask: torch.Tensor | None = None, prompts: torch.Tensor | None = None,
    extras: dict[str, torch.Tensor] | None = None,
    grad_extras: dict[str, torch.Tensor] | None = None, timeout_s: float | None = None,
    adapter: str | None = None, call_id: str | None = None,
) -> m.BackwardResponse:  # fmt: skip
    req = m.BackwardRequest(model, hop.start_block, hop.end_block, hidden, grad_outputs,
                            attention_mask, prompts, extras or {}, grad_extras or {},
                            adapter)  # fmt: skip
    return await post_frame(http, hop, "backward", req, m.BackwardResponse, config, timeout_s,
                            call_id, extras=tuple(req.extras))  # fmt: skip


async def compute_status(http: aiohttp.ClientSession, hop: Hop, config: ClientConfig, *,
                         session_id: str = "", call_id: str = "") -> ComputeStatus:  # fmt: skip
    """GET /compute: the server's compute thread now and whether session `session_id` has a
    step there, or call `call_id` is being served (drift.wire.progress), within
    min_step_timeout_s; PeerUnavailable if it does not answer."""
    path = f"{COMPUTE_PATH}?" + (f"session={session_id}" if session_id else f"call={call_id}")
    headers = auth_headers(config.swarm_key, "GET", path, peer_id=hop.peer_id)
    body = await _request(http, "GET", hop, path, headers, config, config.min_step_timeout_s)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PeerUnavailable(f"{hop.peer_id}: /compute is not JSON", peer_id=hop.peer_id) from exc
    return ComputeStatus.from_wire(obj)
