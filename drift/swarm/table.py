"""The membership table: the newest valid record of every peer, merged from gossip.

Merge rules: the signature must verify against the record's own peer id (so a record can
only be signed by the peer it describes); higher `seq` wins; expired records are dropped.
Rejections are counted by reason. The clock is passed in, so this is pure bookkeeping.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from drift.swarm.record import PeerRecord
from drift.wire.errors import BadRequest


class MembershipTable:
    """Records by peer id; `merge` is the only way in."""

    def __init__(self, self_peer_id: str | None = None) -> None:
        self.self_peer_id = self_peer_id
        # An expired record is forgotten with its seq: replaying an older record of the
        # same peer cannot revive it, since the older record expired even earlier.
        self._records: dict[str, PeerRecord] = {}
        self.rejected: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._records

    def get(self, peer_id: str) -> PeerRecord | None:
        return self._records.get(peer_id)

    def records(self) -> list[PeerRecord]:
        """Every held record (live and offline), by peer id."""
        return [self._records[k] for k in sorted(self._records)]

    def live(self, now: float) -> list[PeerRecord]:
        """Unexpired records of peers not offline."""
        return [r for r in self.records() if r.state != "offline" and r.expires_at > now]

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
        if not record.verify():
            self.rejected["bad_signature"] += 1
            return False
        self._records[record.peer_id] = record
        return True

    def merge_wire(self, items: Iterable[Any], now: float, *, skip: str | None = None) -> int:
        """Merge raw JSON records; malformed ones are counted, not raised. Returns #changed."""
        changed = 0
        for item in items:
            try:
                record = PeerRecord.from_wire(item)
            except BadRequest:
                self.rejected["malformed"] += 1
                continue
            if record.peer_id == skip:
                continue
            changed += self.merge(record, now)
        return changed

    def expire(self, now: float) -> list[str]:
        """Drop expired records; returns the peer ids dropped."""
        gone = [k for k, r in self._records.items() if r.expires_at <= now]
        for k in gone:
            del self._records[k]
        return gone
