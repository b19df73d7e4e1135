"""Checking membership records a client reads from a peer's GET /swarm.

A record is used only when its signature verifies against its own peer id and it has not
expired; then it becomes a routing ServerInfo. Knows nothing about HTTP.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import orjson

from drift.client.routing import ServerInfo
from drift.identity.keys import verify_signature


def canonical_bytes(record: dict[str, Any]) -> bytes:
    """The bytes a record's signature covers: orjson, sorted keys, without `signature`."""
    body = {k: v for k, v in record.items() if k != "signature"}
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def verify_record(record: Any, *, now: float | None = None) -> bool:
    """True when the record is well-formed, signed by its peer id and not expired."""
    if not isinstance(record, dict):
        return False
    peer_id, signature = record.get("peer_id"), record.get("signature")
    if not isinstance(peer_id, str) or not isinstance(signature, str):
        return False
    try:
        raw_sig = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    if not verify_signature(peer_id, canonical_bytes(record), raw_sig):
        return False
    expires_at = record.get("expires_at")
    if not isinstance(expires_at, int | float):
        return False
    return expires_at > (time.time() if now is None else now)


def merge_records(
    table: dict[str, dict[str, Any]], incoming: list[Any], *, now: float | None = None
) -> int:
    """Add verified records to `table` (peer_id -> record), higher seq wins; count rejects."""
    rejected = 0
    for record in incoming:
        if not verify_record(record, now=now):
            rejected += 1
            continue
        old = table.get(record["peer_id"])
        if old is None or int(record.get("seq", 0)) > int(old.get("seq", 0)):
            table[record["peer_id"]] = record
    return rejected


def server_infos(
    table: dict[str, dict[str, Any]], model_fingerprint: str, *, now: float | None = None
) -> list[ServerInfo]:
    """Online, unexpired servers of this model as routing entries."""
    now = time.time() if now is None else now
    out = []
    for r in table.values():
        if r.get("state") != "online" or r.get("model_fingerprint") != model_fingerprint:
            continue
        if not isinstance(r.get("expires_at"), int | float) or r["expires_at"] <= now:
            continue
        start, end, addrs = r.get("start_block"), r.get("end_block"), r.get("addrs")
        if not isinstance(start, int) or not isinstance(end, int) or not addrs:
            continue
        out.append(
            ServerInfo(
                peer_id=r["peer_id"],
                addr=str(addrs[0]).rstrip("/"),
                start_block=start,
                end_block=end,
                throughput=float(r.get("throughput") or 1.0),
                cache_tokens_left=int(r.get("cache_tokens_left") or 0),
            )
        )
    return out
