"""The wire side of gossip: message shapes, the identity proof, one HTTP exchange.

A gossip request is `{"peer_id", "records": [...], "nonce"}`; the reply is
`{"peer_id", "records": [...], "proof"}` where proof = base64 Ed25519 signature of
`PROOF_PREFIX + nonce` by the answering peer, so the caller knows who answered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
from typing import Any

import aiohttp
import orjson

from drift.identity import Identity, verify_signature
from drift.wire.auth import auth_headers
from drift.wire.errors import BadRequest, Forbidden, PeerUnavailable, from_payload

PROOF_PREFIX = b"drift-gossip-proof:"
GOSSIP_PATH = "/swarm/gossip"
MAX_NONCE_CHARS = 128


def new_nonce() -> str:
    return secrets.token_hex(16)


def sign_proof(identity: Identity, nonce: str) -> str:
    return base64.b64encode(identity.sign(PROOF_PREFIX + nonce.encode())).decode("ascii")


def check_proof(peer_id: str, nonce: str, proof: Any) -> bool:
    if not isinstance(proof, str):
        return False
    try:
        sig = base64.b64decode(proof, validate=True)
    except (binascii.Error, ValueError):
        return False
    return verify_signature(peer_id, PROOF_PREFIX + nonce.encode(), sig)


def parse_gossip_body(data: Any, max_records: int) -> tuple[str | None, list[Any], str | None]:
    """(caller peer id, raw records, nonce) of a gossip request; BadRequest if malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise BadRequest('gossip body must be {"peer_id", "records": [...], "nonce"}')
    if len(data["records"]) > max_records:
        raise BadRequest(f"gossip body holds {len(data['records'])} records (limit {max_records})")
    nonce = data.get("nonce")
    if nonce is not None and (not isinstance(nonce, str) or not 0 < len(nonce) <= MAX_NONCE_CHARS):
        raise BadRequest(f"gossip nonce must be a string of 1..{MAX_NONCE_CHARS} characters")
    peer_id = data.get("peer_id")
    return (peer_id if isinstance(peer_id, str) else None), data["records"], nonce


async def exchange(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    expect_peer_id: str,
    swarm_key: str | None,
    timeout_s: float,
) -> tuple[dict[str, Any], int]:
    """POST our table to `url`; returns (reply, bytes moved). Checks the answerer's proof."""
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    headers.update(auth_headers(swarm_key, "POST", GOSSIP_PATH, payload))
    try:
        async with http.post(
            url.rstrip("/") + GOSSIP_PATH,
            data=payload,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise PeerUnavailable(f"gossip with {url} failed: {exc!r}") from exc
    try:
        reply = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PeerUnavailable(f"{url} answered gossip with non-JSON (HTTP {status})") from exc
    if status != 200:
        raise from_payload(reply, status)
    if not isinstance(reply, dict) or not isinstance(reply.get("records"), list):
        raise PeerUnavailable(f"{url} answered gossip without a records list")
    if not check_proof(expect_peer_id, str(body.get("nonce")), reply.get("proof")):
        raise Forbidden(
            f"{url} is not peer {expect_peer_id} (it answered as {reply.get('peer_id')!r} "
            "without a valid signature from that id)"
        )
    return reply, len(payload) + len(raw)
