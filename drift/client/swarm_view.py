"""The client's picture of the swarm: verified records read from any reachable peer.

It starts from the initial peers (join tokens or multiaddrs), reads the table with
drift.swarm.reader (the node's own verification: signature, seq, expiry, via
MembershipTable), refreshes at most every `swarm_refresh_s` (for a new session's route, in
the background: `fresh_enough`), and later reads from any live record's address, so losing
the first peer costs nothing. It measures round trips for routing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

import aiohttp

from drift.client.bans import BanList
from drift.client.config import ClientConfig
from drift.client.latency import LatencyEwma
from drift.client.routing import ServerInfo, missing_blocks
from drift.identity.tokens import JoinToken
from drift.swarm import MembershipTable, PeerRecord, format_ranges, records_for_model
from drift.swarm.reader import fetch_table
from drift.wire.errors import (
    DriftError,
    Forbidden,
    MissingBlocks,
    PeerUnavailable,
    Unauthorized,
)
from drift.wire.version import PROTOCOL_VERSION

log = logging.getLogger(__name__)


class SwarmView:
    def __init__(
        self,
        initial_peers: tuple[JoinToken, ...],
        config: ClientConfig,
        http: aiohttp.ClientSession,
        bans: BanList,
    ) -> None:
        if not initial_peers:
            raise ValueError("initial_peers is empty: give at least one join token or multiaddr")
        self.initial_peers = initial_peers
        self.config = config
        self.http = http
        self.bans = bans
        self.table = MembershipTable()  # the same merge rules as every node's
        self.latency = LatencyEwma()
        self._last_refresh = 0.0
        self._lock = asyncio.Lock()
        self._reading: asyncio.Task[None] | None = None  # a background refresh

    def _sources(self) -> list[tuple[str, str]]:
        """(url, expected peer id) to read the table from: live records first, then members
        whose records expired while this client was idle (they may well still run), then
        the seeds: losing the initial peers costs nothing. Within each, peers this client
        has heard back from come first: a flood of records at dead addresses (anyone may sign
        one) costs a refresh nothing while a known peer answers."""
        live = {r.peer_id for r in self.table.live(time.time())}
        rtt = self.rtt_s
        known = sorted((r for r in self.table.records() if r.state != "offline" and r.addrs
                        and not self.bans.is_banned(r.peer_id)),
                       key=lambda r: (r.peer_id not in live, r.peer_id not in rtt))  # fmt: skip
        return ([(r.addrs[0].rstrip("/"), r.peer_id) for r in known]
                + [(t.url, t.peer_id) for t in self.initial_peers])  # fmt: skip

    async def fresh_enough(self) -> None:
        """A table to route a new session with: read now where none was read yet; else the
        one at hand, re-read in the background once older than `swarm_refresh_s` (reading
        costs a round trip and every record's signature check before a session's first token;
        a route from a stale table that fails is retried with a fresh one: RemoteClient.route,
        the chain's failover)."""
        if not self._last_refresh:
            await self.refresh()
            return
        stale = time.monotonic() - self._last_refresh >= self.config.swarm_refresh_s
        if stale and (self._reading is None or self._reading.done()):
            self._reading = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except DriftError as exc:  # the next route reads again (and raises, if it must)
            log.debug("background read of the swarm table failed: %s", exc)

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            if not force and time.monotonic() - self._last_refresh < self.config.swarm_refresh_s:
                return
            errors = []
            for url, peer_id in self._sources():
                try:
                    reply = await fetch_table(
                        self.http, url, expect_peer_id=peer_id, swarm_key=self.config.swarm_key,
                        timeout_s=self.config.table_timeout_s,
                        connect_timeout_s=self.config.connect_timeout_s,
                    )  # fmt: skip
                except (Unauthorized, Forbidden):
                    raise
                except DriftError as exc:
                    errors.append(f"{url}: {exc.message}")
                    continue
                self.note_rtt(peer_id, reply.seconds)
                self.table.merge_wire(reply.records, time.time())
                self._last_refresh = time.monotonic()
                return
            raise PeerUnavailable(
                "could not read the swarm table from any peer: " + "; ".join(errors[:5])
            )

    @property
    def rtt_s(self) -> dict[str, float]:
        return self.latency.values

    def note_rtt(self, peer_id: str, seconds: float) -> None:
        """One measured round trip (a /swarm read or an inference step on that peer)."""
        self.latency.update(peer_id, seconds)

    def servers(self, model_fingerprint: str, *, banned_too: bool = False,
                degraded_too: bool = False) -> list[ServerInfo]:  # fmt: skip
        """Live, verified servers of this model (not banned ones unless `banned_too`, nor
        degraded ones, whose compute stalls, unless `degraded_too` or `banned_too`), with
        measured round trips."""
        banned = set() if banned_too else self.bans.banned()
        degraded_too = degraded_too or banned_too
        records = records_for_model(self.table.live(time.time()), model_fingerprint)
        return [ServerInfo.from_record(r, self.rtt_s.get(r.peer_id)) for r in records
                if r.peer_id not in banned and (degraded_too or not r.degraded)
                and r.model_fingerprint == model_fingerprint and r.speaks_our_protocol()
                and r.addrs]  # fmt: skip

    def explain(self, exc: MissingBlocks, model_fingerprint: str,
                avoid: Collection[str] = ()) -> MissingBlocks:  # fmt: skip
        """`exc` with why each server this client knows of that holds some of its missing
        blocks was not routed to (stopped, record expired, banned, ...): an operator reading
        "no live server covers" learns whether to restart a server or wait. `avoid`: peers
        the caller left out (servers that said they had no room)."""
        wanted = set(exc.details.get("missing") or ())
        now = time.time()
        reasons = [f"{r.peer_id} (blocks {format_ranges(list(range(*r.span)))}) "
                   f"{self._why_not(r, now, avoid)}"
                   for r in self.table.records()
                   if r.span is not None and model_fingerprint in (r.model_fingerprint, r.model)
                   and wanted & set(range(*r.span))]  # fmt: skip
        if not reasons:
            return exc
        return MissingBlocks(f"{exc.message}; servers of those blocks: " + "; ".join(reasons),
                             **exc.details)  # fmt: skip

    def _why_not(self, record: PeerRecord, now: float, avoid: Collection[str]) -> str:
        deadline = self.table.deadline(record.peer_id)
        if record.state == "offline":
            return "has stopped (its last record says offline)"
        if deadline <= now:
            return f"went silent: its record expired {now - deadline:.0f} s ago"
        if record.state != "online":
            return f"is {record.state}, not yet serving"
        if not record.speaks_our_protocol():
            return f"speaks wire protocol {record.protocol}, this client {PROTOCOL_VERSION}"
        if not record.addrs:
            return "announces no address"
        if record.peer_id in avoid:
            return "has no KV-cache room for this session"
        if self.bans.is_banned(record.peer_id):
            return (f"failed {self.bans.failures(record.peer_id)} time(s) in a row: not routed "
                    f"to for {self.bans.remaining(record.peer_id):.1f} s more")  # fmt: skip
        if record.degraded:
            return f"is degraded: its compute has stalled for {record.optional('degraded_s')} s"
        return "is live (it came back while this request was routed)"

    def refuse_other_protocols(self, model_fingerprint: str, start: int, end: int) -> None:
        """MissingBlocks naming the versions when blocks of [start, end) that no server of
        this protocol covers are served by peers of another major version (a rolling upgrade
        half done); nothing otherwise."""
        records = records_for_model(self.table.live(time.time()), model_fingerprint)
        others = [r for r in records if not r.speaks_our_protocol() and r.addrs]
        if not others:
            return
        missing = missing_blocks(self.servers(model_fingerprint, banned_too=True), start, end)
        theirs = missing_blocks([ServerInfo.from_record(r) for r in others], start, end)
        only_theirs = [b for b in missing if b not in set(theirs)]
        if only_theirs:
            versions = ", ".join(sorted({str(r.protocol) for r in others}))
            raise MissingBlocks(
                f"blocks {format_ranges(only_theirs)} are served only by peers speaking wire "
                f"protocol {versions}; this client speaks {PROTOCOL_VERSION}: upgrade the "
                "older side", missing=only_theirs,
            )  # fmt: skip

    def ban_wait(self, model_fingerprint: str, start: int, end: int) -> float | None:
        """When banned servers worth waiting for (live records; failed once, or by being slow
        or busy rather than refusing the connection: BanList.worth_waiting_for) are what
        covers some of [start, end): the fewest seconds until enough of their bans end. None
        when blocks are missing even with them.

        A step that timed out behind a long prefill on a busy CPU makes the only server of a
        span slow, not missing: waiting for it (bans double per failure, the caller's retries
        are bounded) beats refusing every request meanwhile. A server that refuses
        connections again and again is gone, whatever its record still says."""
        every = [s for s in self.servers(model_fingerprint, banned_too=True)
                 if self.bans.worth_waiting_for(s.peer_id)]  # fmt: skip
        if missing_blocks(every, start, end):
            return None
        for wait in sorted({0.0, *(self.bans.remaining(s.peer_id) for s in every)}):
            ready = [s for s in every if self.bans.remaining(s.peer_id) <= wait]
            if not missing_blocks(ready, start, end):
                return wait
        return None  # not reached: at the longest wait every server is ready

    def num_blocks(self, model_fingerprint: str) -> int | None:
        records = records_for_model(self.table.live(time.time()), model_fingerprint)
        return records[0].num_blocks if records else None
