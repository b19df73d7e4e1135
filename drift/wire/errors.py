"""Errors with stable codes, shared by servers, clients and the API.

Each error names its code (a stable string callers can match on) and its HTTP status:
4xx when the caller is at fault, 5xx when we are. One middleware (drift.node.middleware)
maps them to `{"error": {"code", "message"}}`; clients map that JSON back with `from_payload`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class DriftError(Exception):
    """Base of every error DRIFT raises on purpose."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_payload(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            error["details"] = self.details
        return {"error": error}


class BadRequest(DriftError):
    code = "bad_request"
    status = 400


class BadFrame(BadRequest):
    """A body that is not a valid tensor frame (not safetensors, shapes that lie, ...)."""

    code = "bad_frame"


class BadTensor(BadRequest):
    """A tensor with the wrong dtype, rank or size for this request."""

    code = "bad_tensor"


class SpanNotServed(BadRequest):
    code = "span_not_served"


class ModelMismatch(BadRequest):
    code = "model_mismatch"


class VersionMismatch(BadRequest):
    code = "version_mismatch"


class LengthExceeded(BadRequest, ValueError):
    """A session step past its max_length, or a max_length past the server's limit (also a
    ValueError, as Petals' and transformers' length errors are)."""

    code = "length_exceeded"
    # Petals' clients and tests match this phrase (petals' test_block_exact_match)
    PHRASE: ClassVar[str] = "Maximum length exceeded"

    def __init__(self, message: str, **details: Any) -> None:
        if self.PHRASE.lower() not in message.lower():
            message = f"{self.PHRASE}: {message}"
        super().__init__(message, **details)


class Unauthorized(DriftError):
    code = "unauthorized"
    status = 401


class Forbidden(DriftError):
    code = "forbidden"
    status = 403


class PushRefused(Forbidden):
    """A server will not push a step to the peer it names (not in its swarm table)."""

    code = "push_refused"


class PushForbidden(Forbidden):
    """A pushed step a session does not take: it names an unknown session or lacks the
    session's push token (drift.wire.push)."""

    code = "push_forbidden"


class NotFound(DriftError):
    code = "not_found"
    status = 404


class UnknownSession(NotFound):
    code = "unknown_session"


class UnknownAdapter(NotFound):
    """A LoRA adapter this server does not hold (another may: routing checks records)."""

    code = "unknown_adapter"


class PayloadTooLarge(DriftError):
    code = "payload_too_large"
    status = 413


class CacheFull(DriftError):
    """The server cannot reserve the KV-cache room a session asks for."""

    code = "cache_full"
    status = 503


class Busy(DriftError):
    code = "busy"
    status = 429


class MissingBlocks(DriftError):
    """No live server covers some blocks of the model."""

    code = "missing_blocks"
    status = 503


class PeerUnavailable(DriftError):
    """A remote peer could not be reached or answered with a server error."""

    code = "peer_unavailable"
    status = 502


class InternalError(DriftError):
    code = "internal"
    status = 500


def _all_subclasses(cls: type[DriftError]) -> list[type[DriftError]]:
    out: list[type[DriftError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_class_for(code: str) -> type[DriftError]:
    """The most specific error class for a wire code (DriftError if unknown)."""
    for cls in _all_subclasses(DriftError):
        if cls.code == code:
            return cls
    return DriftError


def from_payload(payload: Any, status: int) -> DriftError:
    """Rebuild an error from a peer's JSON error body (or anything else it sent)."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        code = str(err.get("code", "internal"))
        message = str(err.get("message", ""))
        details = err.get("details") if isinstance(err.get("details"), dict) else {}
        return error_class_for(code)(message, **details)
    if status >= 500:
        return PeerUnavailable(f"peer answered HTTP {status}")
    return BadRequest(f"peer answered HTTP {status}")
