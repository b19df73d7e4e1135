"""The signed membership record: one peer's own description of itself.

Canonical encoding is orjson with sorted keys over every field but `signature`; the
signature is Ed25519 by the key behind `peer_id`, so only the peer itself can sign its
record. Parsing validates every field once (no coercion, so re-encoding is byte-exact).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from drift.identity import Identity, verify_signature
from drift.wire.addr import addr_problem
from drift.wire.errors import BadRequest
from drift.wire.lora import check_adapter_names
from drift.wire.version import PROTOCOL_VERSION, same_major

STATES = ("joining", "online", "offline")
ROLES = ("server", "dht")
MAX_RECORD_BYTES = 4096  # canonical JSON + signature; a real record is under 1 KiB
MAX_ADDRS = 8  # addresses one record may announce
MAX_ADAPTERS = 16  # LoRA adapter names one record may announce
# typed fields a record carries only when set (records without them stay byte-identical)
TYPED_OPTIONAL = ("adapters",)
# The wire protocol a peer speaks ("major.minor", drift.wire.version), kept in `extra` like the
# optional numbers: records of peers that predate the field have none and are taken to speak
# this major version. A peer of another major version stays in the table (status and the
# dashboard show it) but serves no block for routing.
PROTOCOL_FIELD = "protocol"
_PROTOCOL_RE = re.compile(r"\d{1,4}\.\d{1,4}")
# What a server computes on, an opaque name (drift.server.compute_name): servers announcing
# the same one share their cores or GPU, so a client does not overlap their work. Optional,
# kept in `extra` like the protocol.
COMPUTE_FIELD = "compute"
_COMPUTE_RE = re.compile(r"[0-9A-Za-z_:-]{1,64}")

_NUM = (int, float)
# field -> (allowed python types, nullable)
_SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    "peer_id": ((str,), False),
    "addrs": ((list,), False),
    "role": ((str,), False),
    "model": ((str,), True),
    "model_fingerprint": ((str,), True),
    "num_blocks": ((int,), True),
    "start_block": ((int,), True),
    "end_block": ((int,), True),
    "state": ((str,), False),
    "dtype": ((str,), True),
    "quant": ((str,), True),
    "throughput": (_NUM, False),
    "cache_tokens_left": ((int,), False),
    "cache_tokens_total": ((int,), False),
    "active_sessions": ((int,), False),
    "version": ((str,), False),
    "seq": ((int,), False),
    "expires_at": (_NUM, False),
}
# Fields a record may carry or leave out (older peers do not send them), signed like the
# rest when present: a server's live load, which the dashboard charts. Kept in `extra`, so a
# record without them re-encodes byte-exact.
OPTIONAL_FIELDS: dict[str, str] = {
    "steps_per_s": "inference steps per second over the last few seconds",
    "tokens_per_s": "tokens (batch x length) per second through its span, same window",
    "block_tokens_per_s": "tokens x the blocks each ran through, per second, same window",
    "held_sessions": "of active_sessions, those no step used for a while (held prefixes, idle chats)",
    # > 0: the server's compute has not advanced for this long with work queued (its
    # watchdog); such a server serves no block for routing until it is 0 again
    "degraded_s": "seconds its compute has been stalled with work queued (0: healthy)",
    # state stays "online" while draining, so peers of the previous version keep the record
    "draining": "1 while the server hands its sessions over and takes no new ones",
}


@dataclass(frozen=True)
class PeerRecord:
    """One peer's signed record; build it with `sign_record`, read it with `from_wire`."""

    peer_id: str
    addrs: tuple[str, ...]
    role: str
    model: str | None
    model_fingerprint: str | None
    num_blocks: int | None
    start_block: int | None
    end_block: int | None
    state: str
    dtype: str | None
    quant: str | None
    throughput: float
    cache_tokens_left: int
    cache_tokens_total: int
    active_sessions: int
    version: str
    seq: int
    expires_at: float
    signature: str = ""
    adapters: tuple[str, ...] = ()  # names of the LoRA adapters served (drift.wire.lora)
    # unknown fields from newer peers, kept so the signature still verifies when forwarded
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def fields(self) -> dict[str, Any]:
        """Every signed field (not the signature) as JSON-ready values."""
        out = {name: getattr(self, name) for name in _SCHEMA}
        out["addrs"] = list(self.addrs)
        if self.adapters:
            out["adapters"] = list(self.adapters)
        out.update(self.extra)
        return out

    def canonical(self) -> bytes:
        return canonical_bytes(self.fields())

    def to_wire(self) -> dict[str, Any]:
        out = self.fields()
        out["signature"] = self.signature
        return out

    def verify(self) -> bool:
        try:
            sig = base64.b64decode(self.signature, validate=True)
        except (binascii.Error, ValueError):
            return False
        return verify_signature(self.peer_id, self.canonical(), sig)

    def optional(self, name: str) -> float | None:
        """An optional field (OPTIONAL_FIELDS), None when the record has none."""
        value = dict(self.extra).get(name)
        return float(value) if isinstance(value, _NUM) and not isinstance(value, bool) else None

    @property
    def degraded(self) -> bool:
        """Its watchdog says its compute stalls (`degraded_s` > 0; older peers never say)."""
        return (self.optional("degraded_s") or 0.0) > 0

    @property
    def protocol(self) -> str | None:
        """The wire protocol it speaks ("major.minor"); None from peers that predate saying."""
        value = dict(self.extra).get(PROTOCOL_FIELD)
        return value if isinstance(value, str) else None

    @property
    def compute(self) -> str | None:
        """The name of the cores or GPU it computes on; None where it announces none."""
        value = dict(self.extra).get(COMPUTE_FIELD)
        return value if isinstance(value, str) else None

    def speaks_our_protocol(self) -> bool:
        """Whether its routes take this peer's messages: the same protocol major version."""
        return self.protocol is None or same_major(self.protocol)

    def serves(self, block: int) -> bool:
        return (
            self.state == "online"
            and not self.degraded
            and self.speaks_our_protocol()
            and not self.optional("draining")
            and self.start_block is not None
            and self.end_block is not None
            and self.start_block <= block < self.end_block
        )

    @property
    def span(self) -> tuple[int, int] | None:
        if self.start_block is None or self.end_block is None:
            return None
        return self.start_block, self.end_block

    @classmethod
    def from_wire(cls, data: Any) -> PeerRecord:
        """Validate a record from the wire (signature not checked here: see `verify`)."""
        if not isinstance(data, dict):
            raise BadRequest(
                f"a membership record must be a JSON object, got {type(data).__name__}"
            )
        values: dict[str, Any] = {}
        for name, (types, nullable) in _SCHEMA.items():
            if name not in data:
                raise BadRequest(f"membership record lacks field {name!r}")
            value = data[name]
            ok = (value is None and nullable) or (
                isinstance(value, types) and not isinstance(value, bool)
            )
            if not ok:
                raise BadRequest(f"membership record field {name!r} has a bad value {value!r}")
            values[name] = value
        addrs = values["addrs"]
        if len(addrs) > MAX_ADDRS or not all(isinstance(a, str) for a in addrs):
            raise BadRequest(
                f"membership record field 'addrs' must be a list of at most {MAX_ADDRS} strings"
            )
        for addr in addrs:
            problem = addr_problem(addr)
            if problem is not None:
                raise BadRequest(f"membership record field 'addrs': {problem}")
        values["addrs"] = tuple(values["addrs"])
        signature = data.get("signature")
        if not isinstance(signature, str):
            raise BadRequest("membership record lacks a string 'signature'")
        known = {*_SCHEMA, *TYPED_OPTIONAL, "signature"}
        extra = tuple(sorted((k, v) for k, v in data.items() if k not in known))
        for name, value in extra:
            if name in OPTIONAL_FIELDS and (
                not isinstance(value, _NUM) or isinstance(value, bool) or not value >= 0
            ):
                raise BadRequest(f"membership record field {name!r} must be a number >= 0")
            if name == PROTOCOL_FIELD and not (
                isinstance(value, str) and _PROTOCOL_RE.fullmatch(value)
            ):
                raise BadRequest(f"membership record field {name!r} must be 'major.minor'")
            if name == COMPUTE_FIELD and not (
                isinstance(value, str) and _COMPUTE_RE.fullmatch(value)
            ):
                raise BadRequest(f"membership record field {name!r} must be 1-64 letters, "
                                 "digits or _:-")  # fmt: skip
        record = cls(**values, signature=signature, adapters=_adapters(data.get("adapters", [])),
                     extra=extra)  # fmt: skip
        size = len(record.canonical()) + len(signature)
        if size > MAX_RECORD_BYTES:
            raise BadRequest(f"membership record of {size} bytes exceeds {MAX_RECORD_BYTES} bytes")
        _check_consistent(record)
        return record


def _adapters(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        value = None
    if value is None or len(value) > MAX_ADAPTERS:
        raise BadRequest(f"membership record field 'adapters' must be a list of at most "
                         f"{MAX_ADAPTERS} names")  # fmt: skip
    try:
        return check_adapter_names(value)
    except ValueError as exc:
        raise BadRequest(f"membership record field 'adapters': {exc}") from exc


def _check_consistent(record: PeerRecord) -> None:
    if record.state not in STATES:
        raise BadRequest(f"record state {record.state!r} is not one of {STATES}")
    if record.role not in ROLES:
        raise BadRequest(f"record role {record.role!r} is not one of {ROLES}")
    span = record.span
    if (record.start_block is None) != (record.end_block is None):
        raise BadRequest("record start_block and end_block must both be set or both null")
    if span is not None and not 0 <= span[0] < span[1]:
        raise BadRequest(f"record span [{span[0]}, {span[1]}) is empty or negative")
    if span is not None and record.num_blocks is not None and span[1] > record.num_blocks:
        raise BadRequest(f"record span ends at {span[1]} past num_blocks={record.num_blocks}")
    if record.throughput < 0 or record.cache_tokens_left < 0 or record.seq < 0:
        raise BadRequest("record throughput, cache_tokens_left and seq must be >= 0")


def canonical_bytes(fields: dict[str, Any]) -> bytes:
    """The bytes a record's signature covers: orjson, sorted keys, no signature."""
    return orjson.dumps(
        {k: v for k, v in fields.items() if k != "signature"}, option=orjson.OPT_SORT_KEYS
    )


def default_fields(
    peer_id: str, addrs: list[str] | tuple[str, ...], version: str
) -> dict[str, Any]:
    """A `dht` node's record fields before seq and expiry are set."""
    return {
        "peer_id": peer_id,
        "addrs": list(addrs),
        "role": "dht",
        "model": None,
        "model_fingerprint": None,
        "num_blocks": None,
        "start_block": None,
        "end_block": None,
        "state": "online",
        "dtype": None,
        "quant": None,
        "throughput": 0.0,
        "cache_tokens_left": 0,
        "cache_tokens_total": 0,
        "active_sessions": 0,
        "version": version,
        "seq": 0,
        "expires_at": 0.0,
        PROTOCOL_FIELD: PROTOCOL_VERSION,
    }


def sign_record(identity: Identity, fields: dict[str, Any]) -> PeerRecord:
    """Validate `fields` (peer_id must be the identity's) and sign them."""
    if fields.get("peer_id") != identity.peer_id:
        raise BadRequest("a record may only be signed by the peer it describes")
    unknown = set(fields) - set(record_fields())
    if unknown:
        known = sorted(record_fields())
        raise BadRequest(f"unknown record fields {sorted(unknown)}; known: {known}")
    unsigned = PeerRecord.from_wire({**fields, "signature": ""})
    sig = identity.sign(unsigned.canonical())
    return dataclasses.replace(unsigned, signature=base64.b64encode(sig).decode("ascii"))


def record_fields() -> tuple[str, ...]:
    return (*_SCHEMA, *TYPED_OPTIONAL, *OPTIONAL_FIELDS, PROTOCOL_FIELD, COMPUTE_FIELD)


__all__ = [
    "MAX_RECORD_BYTES",
    "OPTIONAL_FIELDS",
    "PeerRecord",
    "canonical_bytes",
    "default_fields",
    "record_fields",
    "sign_record",
]
