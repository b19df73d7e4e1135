"""Reading request bodies under limits: the only way a node's routes read a body.

`read_body` refuses a body past the route's byte limit before reading it (413), reserves its
size from the app's `BodyBudget` (all bodies being held at once; 429 naming the limit when
full), reads with an idle timeout (408), undoes `Content-Encoding: zstd` (a body that is not
zstd is a 400, a zip bomb a 413), and checks a private swarm's signed body hash (403). The
reservation is released when the request ends (`body_middleware`). Knows nothing of routes.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib

from aiohttp import web

from drift.waits import wait_for
from drift.wire.auth import AuthProof, check_body
from drift.wire.errors import BadRequest, Busy, DriftError, PayloadTooLarge
from drift.wire.zstd import ZSTD_MAGIC, decompress

# The AuthProof the auth middleware checked for the request this task serves (None: none).
AUTH_PROOF: contextvars.ContextVar[AuthProof | None] = contextvars.ContextVar(
    "drift_auth_proof", default=None
)
# Bytes of body memory the request this task serves holds (a one-item list, set per request).
_RESERVED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "drift_body_reserved", default=None
)


class RequestTimeout(DriftError):
    code = "request_timeout"
    status = 408


class BodyBudget:
    """Bytes of request bodies held at once across all requests, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def reserve(self, n: int) -> None:
        """Hold `n` more bytes for the current request (Busy when the node is full)."""
        held = _RESERVED.get()
        if held is None:
            raise RuntimeError("read_body outside body_middleware")
        if self.used + n > self.limit:
            raise Busy(f"this node holds {self.used >> 20} MiB of request bodies, its limit is "
                       f"{self.limit >> 20} MiB (max_body_memory); retry shortly")  # fmt: skip
        self.used += n
        held[0] += n


BODY_BUDGET = web.AppKey("body_budget", BodyBudget)


@web.middleware
async def body_middleware(request: web.Request, handler) -> web.StreamResponse:  # type: ignore[no-untyped-def]
    """Give back the body memory a request reserved, however it ends."""
    held = [0]
    token = _RESERVED.set(held)
    try:
        return await handler(request)
    finally:
        _RESERVED.reset(token)
        budget = request.app.get(BODY_BUDGET)
        if budget is not None:
            budget.used -= held[0]


async def read_body(request: web.Request, limit: int, *, idle_timeout_s: float = 30.0,
                    limit_name: str = "this route's limit") -> bytes:  # fmt: skip
    """The whole body, Content-Encoding undone, within `limit` bytes (before and after);
    `limit_name` names the limit in the 413 (e.g. the option that sets it)."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body of {request.content_length} bytes exceeds {limit_name} "
                              f"({limit} bytes)")  # fmt: skip
    budget = request.app.get(BODY_BUDGET)
    held = _RESERVED.get() or [0]
    if budget is not None and request.content_length:
        budget.reserve(request.content_length)
    chunks, size = [], 0
    while True:
        try:
            chunk = await wait_for(request.content.readany(), idle_timeout_s)
        except asyncio.TimeoutError as exc:
            raise RequestTimeout(f"no body data for {idle_timeout_s:.0f} s") from exc
        except web.RequestPayloadError as exc:  # aiohttp could not undo Content-Encoding
            raise BadRequest(f"the body cannot be decoded: {' '.join(str(exc).split())}; "
                             "send it as Content-Encoding zstd or none") from exc  # fmt: skip
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body exceeds {limit_name} ({limit} bytes)")
        if budget is not None and size > held[0]:
            budget.reserve(len(chunk))  # compressed or chunked: counted as it grows
        chunks.append(chunk)
    body = _decode(request, b"".join(chunks), limit)
    proof = AUTH_PROOF.get()
    if proof is not None:
        check_body(proof, hashlib.sha256(body).hexdigest())
    return body


def _decode(request: web.Request, body: bytes, limit: int) -> bytes:
    """Undo `Content-Encoding: zstd` where aiohttp has not already (only zstd or none)."""
    encoding = request.headers.get("Content-Encoding", "").lower()
    if encoding == "zstd":
        return decompress(body, max_bytes=limit) if body.startswith(ZSTD_MAGIC) else body
    if encoding not in ("", "identity"):
        raise BadRequest(f"unsupported Content-Encoding {encoding!r}; use zstd or none")
    return body
