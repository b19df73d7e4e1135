"""Proving the swarm key of a private swarm: an HMAC header (or a bearer token), both sides.

Callers add `auth_headers(key, method, path, body)` to a request; receivers run
`check_auth` (drift.node.auth wraps it in a middleware). The HMAC header is
`X-Drift-Auth: t=<unix time>,mac=<hex>` where mac = HMAC-SHA256(key,
"<METHOD>\\n<path without query>\\n<t>\\n<sha256(body) hex>"); stale timestamps are refused.
Comparisons are constant-time. Missing proof 401, wrong proof 403.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

from drift.wire.errors import Forbidden, Unauthorized

AUTH_HEADER = "X-Drift-Auth"


def _mac(key: str, method: str, path: str, timestamp: str, body: bytes) -> str:
    path = path.split("?", 1)[0]
    message = "\n".join([method.upper(), path, timestamp, hashlib.sha256(body).hexdigest()])
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


def auth_headers(
    swarm_key: str | None, method: str, path: str, body: bytes = b"", *, now: float | None = None
) -> dict[str, str]:
    """Headers proving `swarm_key` for one request ({} without a key). `path` may hold a query."""
    if not swarm_key:
        return {}
    timestamp = f"{time.time() if now is None else now:.3f}"
    return {AUTH_HEADER: f"t={timestamp},mac={_mac(swarm_key, method, path, timestamp, body)}"}


def bearer_headers(swarm_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>` (simplest; sends the key itself, so use it over TLS)."""
    return {"Authorization": f"Bearer {swarm_key}"} if swarm_key else {}


def _parse_hmac(value: str) -> tuple[str, str]:
    parts = dict(p.split("=", 1) for p in value.split(",") if "=" in p)
    if "t" not in parts or "mac" not in parts:
        raise Unauthorized(f"malformed {AUTH_HEADER} header: expected t=<unix time>,mac=<hex>")
    return parts["t"].strip(), parts["mac"].strip()


def check_auth(
    swarm_key: str,
    method: str,
    path: str,
    headers: Any,
    body: bytes,
    *,
    now: float,
    max_skew_s: float,
) -> None:
    """Raise Unauthorized (no proof) or Forbidden (wrong or stale proof)."""
    authorization = headers.get("Authorization", "")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Authorization must be 'Bearer <swarm key>'")
        if not hmac.compare_digest(token.strip().encode(), swarm_key.encode()):
            raise Forbidden("wrong swarm key")
        return
    value = headers.get(AUTH_HEADER)
    if not value:
        raise Unauthorized(
            f"this swarm is private: send 'Authorization: Bearer <swarm key>' or {AUTH_HEADER}"
        )
    timestamp, mac = _parse_hmac(value)
    try:
        when = float(timestamp)
    except ValueError as exc:
        raise Unauthorized(f"{AUTH_HEADER} timestamp {timestamp!r} is not a number") from exc
    if abs(now - when) > max_skew_s:
        raise Forbidden(f"{AUTH_HEADER} timestamp is {now - when:.0f} s off (limit {max_skew_s} s)")
    expected = _mac(swarm_key, method, path, timestamp, body)
    if not hmac.compare_digest(mac.encode(), expected.encode()):
        raise Forbidden("wrong swarm key (HMAC mismatch)")
