"""Handing a live session to another server: the offer, the KV pieces, and the moved notice.

A draining server sends a replacement a signed `handoff_offer` (span, position, adapter,
the shape and dtype of each block's keys/values), then the K/V as binary `handoff_piece`
frames (one block's tokens [t0, t1) each, in order); the replacement answers
`handoff_accepted` with the session's new id and a resume token. The client hears
`session_moved` (where its session now lives) and sends `resume` on a new socket there.
Everything is validated here, once; knows nothing about sockets or caches.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import torch

from drift.wire import checks as c
from drift.wire.addr import addr_problem
from drift.wire.errors import BadRequest, DriftError
from drift.wire.version import PROTOCOL_VERSION

OFFER, ACCEPTED, PIECE, MOVED, RESUME = (
    "handoff_offer", "handoff_accepted", "handoff_piece", "session_moved", "resume",
)  # fmt: skip
KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_LAYERS = 1024  # blocks one offer may describe
MAX_PIECES = 1 << 20  # pieces one offer may announce


class SessionMovedError(DriftError):
    """The session lives on another server now (details: addr, peer_id, session_id, token)."""

    code = "session_moved"
    status = 409


def _addr(obj: dict[str, Any], name: str) -> str:
    value = c.get_str(obj, name)
    problem = addr_problem(value)
    if problem is not None:
        raise BadRequest(f"field {name!r}: {problem}")
    return value


@dataclass(frozen=True)
class LayerKV:
    """One block's cached keys and values: shape [B, kv_heads, length, head_dim] each."""

    block: int
    shape: tuple[int, int, int, int]
    cumulative: int | None  # a sliding-window layer's tokens seen (its past is recorded)

    @classmethod
    def from_wire(cls, obj: Any, batch_size: int) -> LayerKV:
        if not isinstance(obj, dict):
            raise BadRequest("each handoff layer must be an object")
        shape = obj.get("shape")
        if not (isinstance(shape, list) and len(shape) == 4
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)):  # fmt: skip
            raise BadRequest(f"handoff layer shape must be 4 positive ints, got {shape!r}")
        if shape[0] != batch_size:
            raise BadRequest(f"handoff layer batch {shape[0]} is not the session's {batch_size}")
        cum = obj.get("cumulative")
        if cum is not None:
            cum = c.get_int(obj, "cumulative")
        return cls(c.get_int(obj, "block"), (shape[0], shape[1], shape[2], shape[3]), cum)


@dataclass(frozen=True)
class HandoffOffer:
    """What a session needs to go on elsewhere, signed by the sender's identity key."""

    sender: str  # peer id of the draining server (must be a live member of the receiver's table)
    target: str  # peer id of the receiver (an offer for another peer is refused)
    nonce: str  # random, once: a replayed offer is refused
    issued_at: float  # seconds since the epoch (the receiver refuses stale offers)
    model: str  # fingerprint of the model
    start_block: int
    end_block: int
    position: int  # tokens the session holds
    max_length: int
    batch_size: int
    dtype: str  # the session's activation dtype (its steps travel in it)
    kv_dtype: str  # what the K/V pieces travel in
    adapter: str | None
    layers: tuple[LayerKV, ...]
    pieces: int  # binary pieces that follow
    signature: str = ""  # base64 Ed25519 over `signed_bytes()`

    def signed_bytes(self) -> bytes:
        fields = self.to_wire()
        fields.pop("signature")
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)

    def kv_bytes(self) -> int:
        item = torch.empty(0, dtype=KV_DTYPES[self.kv_dtype]).element_size()
        return sum(2 * item * a * b * n * d for a, b, n, d in (x.shape for x in self.layers))

    @classmethod
    def from_wire(cls, obj: Any) -> HandoffOffer:
        obj = c.typed_object(obj, OFFER)
        start, end = c.get_span(obj)
        batch = c.get_int(obj, "batch_size", low=1)
        max_length = c.get_int(obj, "max_length", low=1)
        position = c.get_int(obj, "position", low=1, high=max_length)
        for name, allowed in (("dtype", KV_DTYPES), ("kv_dtype", KV_DTYPES)):
            if obj.get(name) not in allowed:
                raise BadRequest(f"handoff {name} must be one of {sorted(allowed)}")
        raw = obj.get("layers")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_LAYERS:
            raise BadRequest(f"handoff layers must be a list of 1 to {MAX_LAYERS} objects")
        layers = tuple(LayerKV.from_wire(x, batch) for x in raw)
        blocks = [x.block for x in layers]
        # a span's own blocks, and donors before it whose K/V its blocks read (Gemma 4: the
        # K/V a client carried across a cut live in the donor's cache slot)
        if len(set(blocks)) != len(blocks) or not all(0 <= b < end for b in blocks):
            raise BadRequest(f"handoff layers {blocks} repeat or fall outside [0, {end}) "
                             f"(the blocks of [{start}, {end}) and the donors they read)")  # fmt: skip
        issued = obj.get("issued_at")
        if not isinstance(issued, int | float) or isinstance(issued, bool):
            raise BadRequest("handoff issued_at must be a number")
        signature = obj.get("signature")
        if not isinstance(signature, str):
            raise BadRequest("handoff offer lacks a string signature")
        return cls(c.get_str(obj, "sender"), c.get_str(obj, "target"), c.get_str(obj, "nonce"),
                   float(issued), c.get_str(obj, "model"), start, end, position, max_length,
                   batch, obj["dtype"], obj["kv_dtype"], c.get_adapter(obj), layers,
                   c.get_int(obj, "pieces", low=1, high=MAX_PIECES), signature)  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "layers"}
        out["layers"] = [{"block": x.block, "shape": list(x.shape), "cumulative": x.cumulative}
                         for x in self.layers]  # fmt: skip
        return {"type": OFFER, "version": PROTOCOL_VERSION, **out}

    def signature_bytes(self) -> bytes:
        try:
            return base64.b64decode(self.signature, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest("handoff signature is not base64") from exc


@dataclass(frozen=True)
class HandoffPiece:
    """Block `block`'s keys and values for tokens [t0, t0 + T): [B, heads, T, head_dim]."""

    index: int
    block: int
    t0: int
    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None = None  # [B, position] bool, with the first piece only

    @classmethod
    def from_wire(cls, params: dict[str, Any], tensors: dict[str, Any],
                  offer: HandoffOffer) -> HandoffPiece:  # fmt: skip
        c.typed_object(params, PIECE)
        index = c.get_int(params, "index", high=offer.pieces - 1)
        block, t0 = c.get_int(params, "block"), c.get_int(params, "t0")
        layer = next((x for x in offer.layers if x.block == block), None)
        if layer is None:
            raise BadRequest(f"handoff piece for block {block}, which the offer does not name")
        c.no_extra_tensors(tensors, ("keys", "values", "mask"))
        keys, values = c.tensor(tensors, "keys"), c.tensor(tensors, "values")
        b, h, length, d = layer.shape
        for name, t in (("keys", keys), ("values", values)):
            if t.dtype != KV_DTYPES[offer.kv_dtype] or t.dim() != 4 or \
                    (t.shape[0], t.shape[1], t.shape[3]) != (b, h, d) or t.shape[2] < 1 or \
                    t0 + t.shape[2] > length:  # fmt: skip
                raise BadRequest(f"handoff piece {name} {tuple(t.shape)} {t.dtype} does not fit "
                                 f"block {block}'s {layer.shape} from token {t0}")  # fmt: skip
        if keys.shape != values.shape:
            raise BadRequest("handoff piece keys and values differ in shape")
        mask = tensors.get("mask")
        if (mask is None) != (index != 0):
            raise BadRequest("the first handoff piece, and only it, carries the mask")
        if mask is not None:
            mask = c.check_mask("mask", mask, (offer.batch_size, offer.position))
        return cls(index, block, t0, keys, values, mask)

    def to_wire(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        params = {"type": PIECE, "version": PROTOCOL_VERSION, "index": self.index,
                  "block": self.block, "t0": self.t0}  # fmt: skip
        tensors = {"keys": self.keys.contiguous(), "values": self.values.contiguous()}
        if self.mask is not None:
            tensors["mask"] = self.mask.contiguous()
        return params, tensors


@dataclass(frozen=True)
class HandoffAccepted:
    """The receiver holds the session now, parked under `session_id` until `resume`."""

    session_id: str
    token: str  # the secret the client shows with `resume`

    @classmethod
    def from_wire(cls, obj: Any) -> HandoffAccepted:
        obj = c.typed_object(obj, ACCEPTED)
        return cls(c.get_str(obj, "session_id"), c.get_str(obj, "token"))

    def to_wire(self) -> dict[str, Any]:
        return {"type": ACCEPTED, "version": PROTOCOL_VERSION, "session_id": self.session_id,
                "token": self.token}  # fmt: skip


@dataclass(frozen=True)
class SessionMoved:
    """To the client: its session lives at `peer_id` / `addr` now, under `session_id`."""

    addr: str
    peer_id: str
    session_id: str
    token: str
    step_id: int | None = None  # the step this answers, when one came

    @classmethod
    def from_wire(cls, obj: Any) -> SessionMoved:
        obj = c.typed_object(obj, MOVED)
        step = obj.get("step_id")
        return cls(_addr(obj, "addr"), c.get_str(obj, "peer_id"), c.get_str(obj, "session_id"),
                   c.get_str(obj, "token"),
                   None if step is None else c.get_int(obj, "step_id"))  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": MOVED, "version": PROTOCOL_VERSION, "addr": self.addr,
               "peer_id": self.peer_id, "session_id": self.session_id, "token": self.token}  # fmt: skip
        if self.step_id is not None:
            out["step_id"] = self.step_id
        return out

    def error(self) -> SessionMovedError:
        return SessionMovedError(f"the session moved to {self.peer_id} at {self.addr}",
                                 addr=self.addr, peer_id=self.peer_id,
                                 session_id=self.session_id, token=self.token)  # fmt: skip


def raise_if_moved(obj: Any) -> None:
    """SessionMovedError when `obj` (a text message on an inference socket) says so."""
    if isinstance(obj, dict) and obj.get("type") == MOVED:
        raise SessionMoved.from_wire(obj).error()


@dataclass(frozen=True)
class ResumeSession:
    """On a new inference socket: take over the handed-over session `session_id`."""

    session_id: str
    token: str
    dtype: str = "float32"  # the session's activation dtype (the client's own, not sent)

    @classmethod
    def from_wire(cls, obj: Any) -> ResumeSession:
        obj = c.typed_object(obj, RESUME)
        return cls(c.get_str(obj, "session_id"), c.get_str(obj, "token"))

    def to_wire(self) -> dict[str, Any]:
        return {"type": RESUME, "version": PROTOCOL_VERSION, "session_id": self.session_id,
                "token": self.token}  # fmt: skip
