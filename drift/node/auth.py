"""The swarm-key middleware of every node: refuses requests that do not prove the key.

The proof itself (HMAC header or bearer token) is drift.wire.auth's; this only decides
which paths stay open (`/health`, the dashboard's static files) and where to check.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiohttp import web

from drift.wire.auth import AUTH_HEADER, auth_headers, bearer_headers, check_auth

__all__ = ["AUTH_HEADER", "OPEN_PATHS", "OPEN_PREFIXES", "auth_headers", "auth_middleware",
           "bearer_headers", "check_auth"]  # fmt: skip

OPEN_PATHS = ("/", "/health", "/index.html", "/favicon.ico")
OPEN_PREFIXES = ("/static/",)


def auth_middleware(
    swarm_key: str | None,
    *,
    open_paths: Iterable[str] = OPEN_PATHS,
    open_prefixes: Iterable[str] = OPEN_PREFIXES,
    max_skew_s: float = 60.0,
):  # type: ignore[no-untyped-def]
    """Middleware refusing requests without the swarm key (pass-through when key is None)."""
    open_set, prefixes = frozenset(open_paths), tuple(open_prefixes)

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:  # type: ignore[no-untyped-def]
        if swarm_key and request.path not in open_set and not request.path.startswith(prefixes):
            body = await request.read() if request.can_read_body else b""
            check_auth(
                swarm_key,
                request.method,
                request.path,
                request.headers,
                body,
                now=time.time(),
                max_skew_s=max_skew_s,
            )
        return await handler(request)

    return middleware
