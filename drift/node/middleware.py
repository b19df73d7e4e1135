"""One error middleware for every route: errors become `{"error": {"code", "message"}}`.

DriftError -> its status and code; aiohttp HTTPExceptions (404, 405, 413...) -> the same
JSON shape; a caller that went away mid-request (its connection reset while its body was
read) -> a quiet 400 no one receives (logged at debug, not as our error); anything else ->
500 `internal` without leaking a traceback (it is logged).
"""

from __future__ import annotations

import logging

from aiohttp import web

from drift.wire.errors import DriftError

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    429: "busy",
}


def error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:  # type: ignore[no-untyped-def]
    try:
        return await handler(request)
    except DriftError as exc:
        return web.json_response(exc.to_payload(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(
            exc.status, "internal" if exc.status >= 500 else f"http_{exc.status}"
        )
        message = f"{exc.reason}: {request.method} {request.path}"
        if exc.status == 413:
            message = f"request body too large ({exc.reason})"
        response = error_response(exc.status, code, message)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except ConnectionResetError:  # the caller's side: it timed out or died mid-request
        log.debug("%s %s: the caller went away mid-request", request.method, request.path)
        return error_response(400, "bad_request", "the connection was lost mid-request")
    except Exception:
        log.exception("internal error in %s %s", request.method, request.path)
        return error_response(500, "internal", "internal server error")
