"""Which gossiped records a node trusts: admission before the membership table.

In a private swarm every record arrives over an exchange proven with the swarm key, so it goes
straight to the table. In an open swarm addresses are part of identity: a record waits in a
bounded queue until this node has dialled every address it announces and the peer proved its
id at each (`proven`); only then does it reach the table, so nothing this node dials later
(gossip, pushed steps) goes to an address the peer did not prove. A flood of unreachable
identities fills only that queue, never the table; and only its own share of it: each sending
address holds at most `max_pending_per_sender` queued records, and a caller's own record
(the peer that is talking to us, joining) is dialled before records it relays.
Peers that failed a dial are not retried for a while. Pure bookkeeping: the dialling is the
node's (MembershipNode.dial_pending).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from drift.swarm import MembershipTable, PeerRecord


@dataclass(frozen=True)
class AdmissionLimits:
    max_pending: int = 256  # records waiting for a dial; more are dropped until dials finish
    max_pending_per_sender: int = 32  # of those, queued from one sending address
    max_unreachable: int = 4096  # remembered failed peers (oldest forgotten first)
    max_proven: int = 4096  # peers whose proven addresses are remembered (oldest forgotten)
    retry_after_s: float = 60.0  # a peer whose dial failed is not dialled again this soon


class Admission:
    def __init__(self, table: MembershipTable, *, open_swarm: bool,
                 limits: AdmissionLimits = AdmissionLimits()) -> None:  # fmt: skip
        self.table = table
        self.open_swarm = open_swarm
        self.limits = limits
        self.pending: OrderedDict[str, PeerRecord] = OrderedDict()
        self._sender: dict[str, str] = {}  # queued peer id -> the address that sent it
        self._own: set[str] = set()  # queued peer ids that sent their own record (first)
        self.per_sender: Counter[str] = Counter()
        self.unreachable: OrderedDict[str, float] = OrderedDict()  # peer id -> retry time
        self.dropped: Counter[str] = Counter()
        self.proven: OrderedDict[str, set[str]] = OrderedDict()  # peer id -> addrs it proved

    def prove(self, peer_id: str, addr: str) -> None:
        """The peer `peer_id` proved its id at `addr` (an exchange this node made there)."""
        self.proven.setdefault(peer_id, set()).add(addr)
        self.proven.move_to_end(peer_id)
        while len(self.proven) > self.limits.max_proven:
            self.proven.popitem(last=False)

    def is_proven(self, peer_id: str, addr: str) -> bool:
        """Whether `addr` is an address this node may dial for `peer_id`: proven by a dial in
        an open swarm; in a private swarm any address of a record the swarm key vouched for."""
        if not self.open_swarm:
            held = self.table.get(peer_id)
            return held is not None and addr in held.addrs
        return addr in self.proven.get(peer_id, ())

    def unproven(self, record: PeerRecord) -> list[str]:
        """The addresses of `record` its peer has not proven here yet."""
        done = self.proven.get(record.peer_id, set())
        return [a for a in record.addrs if a not in done]

    def offer(self, records: list[PeerRecord], now: float, *, sender: str = "",
              caller: str | None = None) -> int:  # fmt: skip
        """Merge what can be trusted now, queue the rest for a dial; returns #merged.
        `sender`: the address the records came from; `caller`: the peer id it claims."""
        merged = 0
        for record in records:
            if not self.open_swarm or self._known_here(record):
                merged += self.table.merge(record, now)
            else:
                self._queue(record, now, sender, own=record.peer_id == caller)
        return merged

    def _known_here(self, record: PeerRecord) -> bool:
        """Proven at every address it announces, going offline, or older than what is held:
        the table decides without a dial."""
        if record.addrs and not self.unproven(record):
            return True
        held = self.table.get(record.peer_id)
        if held is None:
            return False
        return record.state == "offline" or record.seq <= held.seq

    def _queue(self, record: PeerRecord, now: float, sender: str = "", own: bool = False) -> None:
        if record.state == "offline" or not record.addrs or record.expires_at <= now:
            return  # nothing to dial, nothing worth trusting
        if self.unreachable.get(record.peer_id, 0.0) > now:
            self.dropped["unreachable"] += 1
            return
        queued = self.pending.get(record.peer_id)
        if queued is not None:
            if record.seq > queued.seq:
                self.pending[record.peer_id] = record
            return
        if self.per_sender[sender] >= self.limits.max_pending_per_sender and not (
                own and self._evict(sender)):  # fmt: skip
            self.dropped["sender_full"] += 1
            return
        if len(self.pending) >= self.limits.max_pending and not (
                own and self._evict(self.per_sender.most_common(1)[0][0])):  # fmt: skip
            self.dropped["pending_full"] += 1
            return
        if not record.verify():  # signatures are checked before anything is dialled
            self.table.rejected["bad_signature"] += 1
            return
        self.pending[record.peer_id] = record
        self._sender[record.peer_id] = sender
        self.per_sender[sender] += 1
        if own:
            self._own.add(record.peer_id)

    def _evict(self, sender: str) -> bool:
        """Make room for a caller's own record: drop `sender`'s oldest relayed record."""
        for pid in self.pending:
            if self._sender.get(pid) == sender and pid not in self._own:
                self._pop(pid)
                self.dropped["evicted"] += 1
                return True
        return False

    def _pop(self, peer_id: str) -> PeerRecord:
        record = self.pending.pop(peer_id)
        sender = self._sender.pop(peer_id, "")
        self._own.discard(peer_id)
        self.per_sender[sender] -= 1
        if self.per_sender[sender] <= 0:
            del self.per_sender[sender]
        return record

    def take(self, n: int) -> list[PeerRecord]:
        """Up to `n` queued records to dial (removed from the queue): callers' own records
        first, then the rest, oldest first."""
        order = [pid for pid in self.pending if pid in self._own]
        order += [pid for pid in self.pending if pid not in self._own]
        return [self._pop(pid) for pid in order[:n]]

    def dialled(self, record: PeerRecord, ok: bool, now: float) -> None:
        """The outcome of dialling every address of `record`: trusted (each address proven),
        or not retried for a while."""
        if ok:
            for addr in record.addrs:
                self.prove(record.peer_id, addr)
            self.unreachable.pop(record.peer_id, None)
            self.table.merge(record, now)
            return
        self.unreachable[record.peer_id] = now + self.limits.retry_after_s
        self.unreachable.move_to_end(record.peer_id)
        while len(self.unreachable) > self.limits.max_unreachable:
            self.unreachable.popitem(last=False)
