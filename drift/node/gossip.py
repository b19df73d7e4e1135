"""The wire side of gossip: message shapes, the identity proof, one HTTP exchange.

A gossip request is `{"peer_id", "records": [...], "nonce", "pull"}`; the reply is
`{"peer_id", "records": [...], "proof"}` where proof = base64 Ed25519 signature of
`PROOF_PREFIX + nonce` by the answering peer, so the caller knows who answered. With
`"pull": false` the reply holds only the answerer's own record (a leave, or a dial that
checks a new peer's address). Bodies and replies are bounded by `gossip_body_limit`.
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
from drift.swarm.dial import is_wrong_peer, peer_ssl
from drift.swarm.reader import dial_failure, read_limited
from drift.swarm.record import MAX_RECORD_BYTES
from drift.wire.auth import auth_headers, check_reply
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


def gossip_body_limit(max_records: int) -> int:
    """Largest gossip body or reply in bytes: `max_records` records of the largest size."""
    return max_records * (MAX_RECORD_BYTES + 64) + (64 << 10)


def parse_gossip_body(data: Any, max_records: int) -> tuple[list[Any], str | None, bool]:
    """(raw records, nonce, pull) of a gossip request; BadRequest if malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise BadRequest('gossip body must be {"peer_id", "records": [...], "nonce"}')
    if len(data["records"]) > max_records:
        raise BadRequest(f"gossip body holds {len(data['records'])} records (limit {max_records})")
    nonce = data.get("nonce")
    if nonce is not None and (not isinstance(nonce, str) or not 0 < len(nonce) <= MAX_NONCE_CHARS):
        raise BadRequest(f"gossip nonce must be a string of 1..{MAX_NONCE_CHARS} characters")
    pull = data.get("pull", True)
    if not isinstance(pull, bool):
        raise BadRequest("gossip 'pull' must be true or false")
    return data["records"], nonce, pull


async def exchange(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    expect_peer_id: str,
    swarm_key: str | None,
    timeout_s: float,
    max_records: int = 1100,
) -> tuple[dict[str, Any], int]:
    """POST our table to `url`; returns (reply, bytes moved). Checks the answerer's proof;
    a reply past `gossip_body_limit(max_records)` is refused before it is all read."""
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    sent = auth_headers(swarm_key, "POST", GOSSIP_PATH, payload, peer_id=expect_peer_id)
    headers.update(sent)
    try:
        async with http.post(
            url.rstrip("/") + GOSSIP_PATH,
            data=payload,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            ssl=peer_ssl(expect_peer_id),
        ) as resp:
            raw = await read_limited(resp, gossip_body_limit(max_records))
            status = resp.status
            reply_headers = resp.headers
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if is_wrong_peer(exc):
            raise Forbidden(f"{url} is not peer {expect_peer_id}: its TLS certificate proves "
                            "another identity (a man in the middle?)") from exc  # fmt: skip
        raise PeerUnavailable(
            f"gossip with {url} failed: {await dial_failure(exc, url, expect_peer_id)}"
        ) from exc
    try:
        reply = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise PeerUnavailable(f"{url} answered gossip with non-JSON (HTTP {status})") from exc
    if status != 200:
        raise from_payload(reply, status)
    check_reply(swarm_key, sent, status, reply_headers, raw, what=url)
    if not isinstance(reply, dict) or not isinstance(reply.get("records"), list):
        raise PeerUnavailable(f"{url} answered gossip without a records list")
    if len(reply["records"]) > max_records:
        raise PeerUnavailable(f"{url} answered gossip with {len(reply['records'])} records "
                              f"(limit {max_records})")  # fmt: skip
    if not check_proof(expect_peer_id, str(body.get("nonce")), reply.get("proof")):
        raise Forbidden(
            f"{url} is not peer {expect_peer_id} (it answered as {reply.get('peer_id')!r} "
            "without a valid signature from that id)"
        )
    return reply, len(payload) + len(raw)
