"""The swarm-key middleware of every node: refuses requests that do not prove the key.

The proof itself is drift.wire.auth's; this decides which paths stay open (`/health`, the
dashboard's static files), checks the header before any body is read (the body's signed hash
is checked by drift.node.body.read_body), remembers nonces (replays are refused) and signs
byte replies so callers know a key holder answered.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiohttp import web

from drift.node.body import AUTH_PROOF
from drift.wire.auth import (
    AUTH_HEADER,
    ReplayCache,
    auth_headers,
    bearer_headers,
    check_request,
    reply_headers,
)

__all__ = ["AUTH_HEADER", "OPEN_PATHS", "OPEN_PREFIXES", "auth_headers", "auth_middleware",
           "bearer_headers"]  # fmt: skip

OPEN_PATHS = ("/", "/health", "/index.html", "/favicon.ico")
OPEN_PREFIXES = ("/static/",)


def auth_middleware(
    swarm_key: str | None,
    peer_id: str,
    *,
    open_paths: Iterable[str] = OPEN_PATHS,
    open_prefixes: Iterable[str] = OPEN_PREFIXES,
    max_skew_s: float = 60.0,
    replay_entries: int = 65536,
):  # type: ignore[no-untyped-def]
    """Middleware refusing requests without the swarm key (pass-through when key is None)."""
    open_set, prefixes = frozenset(open_paths), tuple(open_prefixes)
    replay = ReplayCache(max_skew_s, replay_entries)

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:  # type: ignore[no-untyped-def]
        if not swarm_key or request.path in open_set or request.path.startswith(prefixes):
            return await handler(request)
        proof = check_request(
            swarm_key, request.method, request.path, list(request.rel_url.query.items()),
            request.headers, peer_id=peer_id, now=time.time(), max_skew_s=max_skew_s,
            replay=replay,
        )  # fmt: skip
        token = AUTH_PROOF.set(proof)
        try:
            response = await handler(request)
        finally:
            AUTH_PROOF.reset(token)
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            response.headers.update(reply_headers(swarm_key, proof, response.status,
                                                  response.body))  # fmt: skip
        return response

    return middleware
