"""The one codec between typed messages and bytes, used by every edge (server routes, steps,
push links, the client's transport): tensor frames with activations packed to a wire form
(frames.py, compress.py), JSON text messages, and zstd bodies (zstd.py).

A message is anything with `to_wire()` / `from_wire(...)` (messages.py, step.py). Knows
nothing about sockets or models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import torch

from drift.wire.compress import WIRE_DTYPE, check_form, pack, unpack
from drift.wire.errors import BadRequest
from drift.wire.frames import decode_frame, encode_frame
from drift.wire.push import PushTarget, pushed_target
from drift.wire.zstd import compress

Tensors = dict[str, torch.Tensor]
ZSTD_LEVEL = 1  # bodies are compressed on the hot path: speed over ratio


def encode(message: Any, wire_dtype: str | None = None) -> bytes:
    """A tensor-bearing message as frame bytes, its activations packed as `wire_dtype`."""
    params, tensors = message.to_wire()
    return encode_frame(params, pack(params, tensors, wire_dtype))


def decode(cls: Any, body: bytes, compute_dtype: torch.dtype = torch.float32,
           **expect: Any) -> Any:  # fmt: skip
    """Frame bytes -> a validated message of `cls` (expect: its from_wire's checks)."""
    return Frame.read(body).message(cls, compute_dtype, **expect)


@dataclass(frozen=True)
class Frame:
    """A frame read and checked as a frame, not yet as a message: what an edge needs to know
    before it can validate one (the session a pushed step is for, the step an error is of)."""

    params: dict[str, Any]
    tensors: Tensors

    @classmethod
    def read(cls, body: bytes, *, max_bytes: int | None = None) -> Frame:
        return cls(*decode_frame(body, max_bytes=max_bytes))

    @property
    def form(self) -> str | None:
        """The wire form its activations travel in (a reply goes back in the same)."""
        return check_form(self.params.get(WIRE_DTYPE))

    @property
    def step_id(self) -> int | None:
        """Its step id if it names a well-formed one (to address an error or skip a stale
        reply), else None; `message` validates it."""
        return _int_or_none(self.params.get("step_id"))

    def push_target(self) -> PushTarget:
        """The session a pushed step is for and its push token (BadRequest when it names
        no session)."""
        return pushed_target(self.params)

    def message(self, cls: Any, compute_dtype: torch.dtype, **expect: Any) -> Any:
        """The validated message of `cls`, its activations restored to `compute_dtype`."""
        tensors = unpack(self.params, self.tensors, compute_dtype)
        return cls.from_wire(self.params, tensors, **expect)


def encode_text(message: Any) -> str:
    """A JSON message (or a plain JSON object) as a text frame."""
    obj = message if isinstance(message, dict) else message.to_wire()
    return orjson.dumps(obj).decode()


def read_text(data: str | bytes) -> tuple[str | None, Any]:
    """(its `type`, the JSON value) of a text message; BadRequest when it is not JSON."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    kind = obj.get("type") if isinstance(obj, dict) else None
    return (kind if isinstance(kind, str) else None), obj


def text_step_id(obj: Any) -> int | None:
    """The step a text message (an error) is about, if it names a well-formed one."""
    return _int_or_none(obj.get("step_id")) if isinstance(obj, dict) else None


def compress_body(frame: bytes, min_bytes: int) -> tuple[bytes, dict[str, str]]:
    """(the body, its extra headers): zstd from `min_bytes` on (0: never)."""
    if min_bytes and len(frame) >= min_bytes:
        return compress(frame, ZSTD_LEVEL), {"Content-Encoding": "zstd"}
    return frame, {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
