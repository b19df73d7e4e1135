"""The API app's middlewares, outermost first: CORS, metrics, OpenAI-shaped errors, keys.

- `add_cors(app, origins)`: answers preflight `OPTIONS` itself (no key needed) and adds
  `Access-Control-Allow-Origin` for allowed origins ("*" allows any), streams included.
- `counted(metrics)`: counts every /v1 request by route and status, with its duration.
- `openai_errors`: every error becomes `{"error": {"message", "type", "param", "code"}}`;
  429 and 503 carry `Retry-After`.
- `bearer_auth(keys)`: `Authorization: Bearer` on /v1, compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from aiohttp import web

from drift.api.metrics import ApiMetrics
from drift.api.render import drift_error_body, error_body
from drift.wire.errors import BadRequest, DriftError, Forbidden, Unauthorized

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RETRY_AFTER_S = {429: 1, 503: 5}  # seconds a client should wait before retrying
_ALLOW_METHODS = "GET, POST, OPTIONS"
_ALLOW_HEADERS = "Authorization, Content-Type"
_EXPOSE_HEADERS = "Retry-After"


def json_response(body: Any, status: int = 200) -> web.Response:
    response = web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
    if status in RETRY_AFTER_S:
        response.headers["Retry-After"] = str(RETRY_AFTER_S[status])
    return response


def add_cors(app: web.Application, origins: Sequence[str]) -> None:
    """Answer preflights (before any key check) and mark responses for allowed origins;
    headers are added as a response is prepared, so streams get them too."""
    allowed = frozenset(origins)

    def allow(origin: str | None) -> str | None:
        if origin is None:
            return None
        return "*" if "*" in allowed else (origin if origin in allowed else None)

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (request.method == "POST" and "Origin" in request.headers
                and request.content_type != "application/json"):  # fmt: skip
            # a browser's "simple" cross-origin POST (text/plain, a form) skips the preflight:
            # refused, so a page cannot run generations on a keyless (--no_auth) API
            refused = BadRequest("a POST from a browser must send 'Content-Type: "
                                 f"application/json' (got {request.content_type!r})")  # fmt: skip
            return json_response(drift_error_body(refused), 415)
        if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
            return await handler(request)
        origin = request.headers.get("Origin")
        if allow(origin) is None:
            hint = "--cors_origins " + (origin or "<origin>")
            error = Forbidden(f"origin {origin!r} is not allowed; start drift api with {hint}")
            return json_response(drift_error_body(error), error.status)
        headers = {
            "Access-Control-Allow-Methods": _ALLOW_METHODS,
            "Access-Control-Allow-Headers": request.headers.get(
                "Access-Control-Request-Headers", _ALLOW_HEADERS
            ),
            "Access-Control-Max-Age": "600",
        }
        return web.Response(status=204, headers=headers)  # origin headers: on_prepare

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        value = allow(request.headers.get("Origin"))
        if value is not None:
            response.headers["Access-Control-Allow-Origin"] = value
            response.headers["Access-Control-Expose-Headers"] = _EXPOSE_HEADERS
            response.headers["Vary"] = "Origin"

    app.middlewares.insert(0, preflight)
    app.on_response_prepare.append(on_prepare)


def counted(metrics: ApiMetrics) -> Any:
    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1"):
            return await handler(request)
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            route = request.match_info.route.resource
            name = route.canonical if route is not None else "unmatched"
            metrics.request(name, status, time.perf_counter() - started)

    return count


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except DriftError as exc:
        return json_response(drift_error_body(exc), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_response(error_body(exc.status, f"{exc.reason}: {request.path}", None),
                             exc.status)  # fmt: skip
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return json_response(error_body(500, "internal server error", "internal"), 500)


def bearer_auth(keys: Sequence[str]) -> Any:
    wanted = [k.encode() for k in keys]

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if wanted and request.path.startswith("/v1"):
            header = request.headers.get("Authorization", "")
            given = header[7:].strip().encode() if header.startswith("Bearer ") else b""
            ok = False
            for key in wanted:  # compare against every key: time does not depend on which
                ok |= hmac.compare_digest(given, key)
            if not ok:
                raise Unauthorized(
                    "incorrect API key provided"
                    if given
                    else "missing API key: send 'Authorization: Bearer <key>'"
                )
        return await handler(request)

    return check_key
