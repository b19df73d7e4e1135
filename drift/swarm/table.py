"""The membership table: the newest valid record of every peer, merged from gossip, bounded.

Merge rules: the signature must verify against the record's own peer id (so a record can
only be signed by the peer it describes); higher `seq` wins; expired records are dropped. A
record is kept no longer than `max_ttl_s` whatever expiry it signed, the table holds at most
`max_records` peers, and while a peer's record is live a record of the same id at other
addresses is refused (two processes sharing one identity cannot flap each other: the one
held first stays). Rejections are counted by reason. The clock is passed in: pure bookkeeping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from drift.swarm.record import PeerRecord
from drift.wire.errors import BadRequest

DEFAULT_MAX_RECORDS = 1024  # peers one table holds
DEFAULT_MAX_TTL_S = 300.0  # longest a record is kept past its arrival, whatever it signed


class MembershipTable:
    """Records by peer id; `merge` is the only way in."""

    def __init__(
        self, self_peer_id: str | None = None, *, max_records: int = DEFAULT_MAX_RECORDS,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
    ) -> None:  # fmt: skip
        self.self_peer_id = self_peer_id
        self.max_records = max_records
        self.max_ttl_s = max_ttl_s
        # An expired record is forgotten with its seq: replaying an older record of the
        # same peer cannot revive it, since the older record expired even earlier.
        self._records: dict[str, PeerRecord] = {}
        self._deadline: dict[str, float] = {}  # when each record is dropped (clamped expiry)
        self.rejected: Counter[str] = Counter()
        self.conflicts: dict[str, PeerRecord] = {}  # peer id -> the last refused twin record

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._records

    def get(self, peer_id: str) -> PeerRecord | None:
        return self._records.get(peer_id)

    def deadline(self, peer_id: str) -> float:
        """When the held record of `peer_id` expires here (its own expiry, clamped)."""
        return self._deadline[peer_id]

    def records(self) -> list[PeerRecord]:
        """Every held record (live and offline), by peer id."""
        return [self._records[k] for k in sorted(self._records)]

    def live(self, now: float) -> list[PeerRecord]:
        """Unexpired records of peers not offline."""
        return [r for r in self.records()
                if r.state != "offline" and self._deadline[r.peer_id] > now]  # fmt: skip

    def is_live(self, peer_id: str, now: float) -> bool:
        held = self._records.get(peer_id)
        return held is not None and held.state != "offline" and self._deadline[peer_id] > now

    def merge(self, record: PeerRecord, now: float) -> bool:
        """Take `record` if valid and newer; True when the table changed."""
        if record.expires_at <= now:
            self.rejected["expired"] += 1
            return False
        held = self._records.get(record.peer_id)
        if held is not None and record.seq <= held.seq:
            if record.seq < held.seq:
                self.rejected["stale"] += 1
            return False
        if held is None and len(self._records) >= self.max_records:
            self.expire(now)
            if len(self._records) >= self.max_records:
                self.rejected["table_full"] += 1
                return False
        if not record.verify():
            self.rejected["bad_signature"] += 1
            return False
        if held is not None and self._is_twin(held, record, now):
            self.rejected["conflict"] += 1
            self.conflicts[record.peer_id] = record
            return False
        self._records[record.peer_id] = record
        self._deadline[record.peer_id] = min(record.expires_at, now + self.max_ttl_s)
        return True

    def _is_twin(self, held: PeerRecord, record: PeerRecord, now: float) -> bool:
        """Another process signing as the same peer: other addresses while ours is live."""
        return (
            self.is_live(held.peer_id, now)
            and bool(held.addrs)
            and bool(record.addrs)
            and set(held.addrs) != set(record.addrs)
        )

    def merge_wire(self, items: Iterable[Any], now: float, *, skip: str | None = None) -> int:
        """Merge raw JSON records; malformed ones are counted, not raised. Returns #changed."""
        changed = 0
        for record in self.parse_wire(items, skip=skip):
            changed += self.merge(record, now)
        return changed

    def parse_wire(self, items: Iterable[Any], *, skip: str | None = None) -> list[PeerRecord]:
        """Raw JSON records as PeerRecords (signature not checked); malformed ones counted."""
        out = []
        for item in items:
            try:
                record = PeerRecord.from_wire(item)
            except BadRequest:
                self.rejected["malformed"] += 1
                continue
            if record.peer_id != skip:
                out.append(record)
        return out

    def expire(self, now: float) -> list[str]:
        """Drop expired records; returns the peer ids dropped."""
        gone = [k for k, deadline in self._deadline.items() if deadline <= now]
        for k in gone:
            del self._records[k]
            del self._deadline[k]
            self.conflicts.pop(k, None)
        return gone
