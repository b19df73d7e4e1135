"""Proving the swarm key of a private swarm, both ways, without sending the key.

A caller adds `auth_headers(key, method, path, body, peer_id=...)`: `X-Drift-Auth:
v=2,t=<unix time>,n=<nonce>,to=<peer id>,h=<sha256(body) hex>,mac=<hex>`, where mac =
HMAC-SHA256(key, "drift-auth-2\\n" METHOD \\n path \\n canonical query \\n to \\n t \\n n \\n h).
It covers method, path, query and body, names the one node it is for (`to`: a captured header
is worthless on another node), and its nonce is accepted once (`ReplayCache`). A receiver
checks the header before reading any body (`check_request`), then the body against `h`
(`check_body`). Its reply carries `X-Drift-Auth-Reply` (`reply_headers`): an HMAC over the
request's nonce, the status and the reply body, so a caller accepts data only from a key
holder (`check_reply`). `Authorization: Bearer <key>` is accepted for curl (it sends the key:
use it over TLS); DRIFT's own tools never send it. Comparisons are constant-time; a missing
proof is 401, a wrong, stale or replayed one 403.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson

from drift.wire.errors import Forbidden, Unauthorized

AUTH_HEADER = "X-Drift-Auth"
REPLY_HEADER = "X-Drift-Auth-Reply"
_SCHEME = "drift-auth-2"
_REPLY_SCHEME = "drift-reply-2"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_NONCE_CHARS = 64


def canonical_query(query: str | list[tuple[str, str]]) -> str:
    """A query string (raw, or decoded pairs) as the JSON of its sorted decoded pairs."""
    pairs = parse_qsl(query, keep_blank_values=True) if isinstance(query, str) else query
    return orjson.dumps(sorted([k, v] for k, v in pairs)).decode()


def _mac(key: str, fields: list[str]) -> str:
    return hmac.new(key.encode(), "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def _request_fields(method: str, path: str, query: str, proof: AuthProof) -> list[str]:
    return [_SCHEME, method.upper(), path, query, proof.audience, proof.timestamp, proof.nonce,
            proof.body_sha256]  # fmt: skip


@dataclass(frozen=True)
class AuthProof:
    """One parsed `X-Drift-Auth` header."""

    timestamp: str  # unix seconds as sent (the MAC covers the text)
    nonce: str
    audience: str  # the peer id of the node the request is for
    body_sha256: str  # hex sha256 of the (uncompressed) body
    mac: str

    @classmethod
    def parse(cls, value: str) -> AuthProof:
        parts = dict(p.strip().split("=", 1) for p in value.split(",") if "=" in p)
        missing = [k for k in ("v", "t", "n", "to", "h", "mac") if not parts.get(k)]
        if missing or parts["v"] != "2":
            raise Unauthorized(f"malformed {AUTH_HEADER} header (missing {missing or ['v=2']}): "
                               "expected v=2,t=<unix time>,n=<nonce>,to=<peer id>,h=<sha256>,"
                               "mac=<hex>")  # fmt: skip
        if len(parts["n"]) > MAX_NONCE_CHARS:
            raise Unauthorized(f"{AUTH_HEADER} nonce is longer than {MAX_NONCE_CHARS} characters")
        return cls(parts["t"], parts["n"], parts["to"], parts["h"].lower(), parts["mac"])

    def to_header(self) -> str:
        return (f"v=2,t={self.timestamp},n={self.nonce},to={self.audience},"
                f"h={self.body_sha256},mac={self.mac}")  # fmt: skip


def auth_headers(
    swarm_key: str | None, method: str, path: str, body: bytes = b"", *, peer_id: str,
    now: float | None = None,
) -> dict[str, str]:  # fmt: skip
    """Headers proving `swarm_key` for one request to the node `peer_id` ({} without a key).
    `path` may hold a query; `body` is the body before any Content-Encoding."""
    if not swarm_key:
        return {}
    route, _, query = path.partition("?")
    stamp = f"{time.time() if now is None else now:.3f}"
    proof = AuthProof(stamp, secrets.token_hex(16), peer_id, hashlib.sha256(body).hexdigest(), "")
    mac = _mac(swarm_key, _request_fields(method, route, canonical_query(query), proof))
    return {AUTH_HEADER: AuthProof(**{**proof.__dict__, "mac": mac}).to_header()}


def bearer_headers(swarm_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>`: what curl may send (the key itself: only over TLS)."""
    return {"Authorization": f"Bearer {swarm_key}"} if swarm_key else {}


class ReplayCache:
    """Nonces accepted in the last `window_s` seconds, at most `max_entries`.

    When full, the oldest nonce is forgotten and every proof not newer than it is refused
    from then on, so a forgotten nonce can never be replayed: the memory stays bounded.
    """

    def __init__(self, window_s: float, max_entries: int = 65536) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> its timestamp
        self.floor = float("-inf")  # proofs at or before this time are refused

    def __len__(self) -> int:
        return len(self._seen)

    def accept(self, nonce: str, when: float, now: float) -> None:
        """Record `nonce`; Forbidden if it was seen or is older than what is remembered."""
        while self._seen:
            oldest, stamp = next(iter(self._seen.items()))
            if stamp >= now - self.window_s:
                break
            del self._seen[oldest]
        if nonce in self._seen:
            raise Forbidden(f"replayed {AUTH_HEADER}: this nonce was already used")
        if when <= self.floor:
            raise Forbidden(f"{AUTH_HEADER} is older than this node's replay memory; retry")
        self._seen[nonce] = when
        if len(self._seen) > self.max_entries:
            _, stamp = self._seen.popitem(last=False)
            self.floor = max(self.floor, stamp)


def check_request(
    swarm_key: str, method: str, path: str, query: str | list[tuple[str, str]], headers: Any,
    *, peer_id: str, now: float, max_skew_s: float, replay: ReplayCache | None,
) -> AuthProof | None:  # fmt: skip
    """Check a request's proof before its body is read; returns it (None for a bearer token,
    which carries no body hash). Raise Unauthorized (no proof) or Forbidden (a wrong, stale,
    misaddressed or replayed one)."""
    authorization = headers.get("Authorization", "")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Authorization must be 'Bearer <swarm key>'")
        if not hmac.compare_digest(token.strip().encode(), swarm_key.encode()):
            raise Forbidden("wrong swarm key")
        return None
    value = headers.get(AUTH_HEADER)
    if not value:
        raise Unauthorized(f"this swarm is private: send {AUTH_HEADER} (the SDK and drift "
                           "commands do, given the swarm key) or, with curl over TLS, "
                           "'Authorization: Bearer <swarm key>'")  # fmt: skip
    proof = AuthProof.parse(value)
    try:
        when = float(proof.timestamp)
    except ValueError as exc:
        raise Unauthorized(f"{AUTH_HEADER} timestamp {proof.timestamp!r} is not a number") from exc
    if not abs(now - when) <= max_skew_s:
        raise Forbidden(f"{AUTH_HEADER} timestamp is {now - when:.0f} s off (limit {max_skew_s} s)")
    expected = _mac(swarm_key, _request_fields(method, path, canonical_query(query), proof))
    if not hmac.compare_digest(proof.mac.encode(), expected.encode()):
        raise Forbidden("wrong swarm key (HMAC mismatch)")
    if proof.audience != peer_id:
        raise Forbidden(f"{AUTH_HEADER} is addressed to {proof.audience[:64]}, not to this node")
    if replay is not None:
        replay.accept(proof.nonce, when, now)
    return proof


def check_body(proof: AuthProof | None, body_sha256: str) -> None:
    """The body read matches the hash its proof signed (Forbidden otherwise)."""
    if proof is not None and not hmac.compare_digest(proof.body_sha256, body_sha256):
        raise Forbidden("the body does not match the hash its swarm-key proof signed")


def expects_body(proof: AuthProof | None) -> bool:
    return proof is not None and proof.body_sha256 != _EMPTY_SHA256


def reply_headers(swarm_key: str | None, proof: AuthProof | None, status: int,
                  body: bytes) -> dict[str, str]:  # fmt: skip
    """Headers proving a reply comes from a key holder ({} without a key or a proof)."""
    if not swarm_key or proof is None:
        return {}
    mac = _mac(swarm_key, [_REPLY_SCHEME, proof.nonce, str(status),
                           hashlib.sha256(body).hexdigest()])  # fmt: skip
    return {REPLY_HEADER: mac}


def check_reply(swarm_key: str | None, sent: dict[str, str], status: int, headers: Any,
                body: bytes, *, what: str) -> None:  # fmt: skip
    """Forbidden unless the reply to a request sent with headers `sent` proves the key."""
    if not swarm_key or AUTH_HEADER not in sent:
        return
    proof = AuthProof.parse(sent[AUTH_HEADER])
    expected = reply_headers(swarm_key, proof, status, body)[REPLY_HEADER]
    if not hmac.compare_digest(str(headers.get(REPLY_HEADER, "")).encode(), expected.encode()):
        raise Forbidden(f"{what} answered without proving the swarm key: not a member")
