"""MembershipNode: this node's identity, its own signed record, the table, and gossip.

It joins through seeds (checking each seed proves its peer id), re-signs its record with a
fresh expiry every round, exchanges tables with a few random live peers, and on leave
publishes a signed `offline` record. It knows nothing about routes or compute.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from drift.identity import Identity, JoinToken, format_hostport
from drift.node.admission import Admission, AdmissionLimits
from drift.node.config import NodeConfig
from drift.node.gossip import exchange, new_nonce, parse_gossip_body, sign_proof
from drift.swarm import MembershipTable, PeerRecord, default_fields, sign_record
from drift.swarm.record import record_fields
from drift.waits import raise_if_cancelling, wait_for
from drift.wire.errors import BadRequest, DriftError

log = logging.getLogger(__name__)

_FIXED = ("peer_id", "seq", "expires_at")


def _local_ip() -> str:
    """The address this host uses for outgoing traffic (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class MembershipNode:
    """Owns identity, table, own record and the gossip loop."""

    def __init__(
        self, identity: Identity, config: NodeConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.identity = identity
        self.config = config
        self.clock = clock
        self.table = MembershipTable(identity.peer_id, max_records=config.max_records,
                                     max_ttl_s=config.record_ttl_s)  # fmt: skip
        self.admission = Admission(self.table, open_swarm=not config.swarm_key,
                                   limits=AdmissionLimits(max_pending=config.max_pending))  # fmt: skip
        self._first_seq = 0  # our first seq this run: later records of our id are a twin's
        self._twin_warned_at = float("-inf")
        self._conflicts_logged: set[str] = set()
        self._inflight: dict[str, asyncio.Task[Any]] = {}  # background exchanges, by peer id
        self._fields: dict[str, Any] = default_fields(identity.peer_id, [], config.version)
        self.record: PeerRecord | None = None
        self.port: int | None = None
        self.http: aiohttp.ClientSession | None = None
        self.bound = asyncio.Event()
        self.rounds = 0
        self.bytes_moved = 0
        self.joined = False
        self.latency_ms: dict[str, float] = {}  # peer id -> gossip round trip (EWMA), ms

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    # -- own record -------------------------------------------------------------------
    def bind(self, port: int) -> None:
        """Set our reachable addresses once the listening port is known; signs the record."""
        self.port = port
        if self.config.public_addrs:
            addrs = list(self.config.public_addrs)
        else:
            host = self.config.public_ip or self.config.host
            if host in ("", "0.0.0.0", "::"):
                host = _local_ip()
            scheme = "https" if self.config.tls else "http"
            addrs = [f"{scheme}://{format_hostport(host, port)}"]
        self.announce(addrs=addrs)
        self.bound.set()

    def announce(self, **fields: Any) -> None:
        """Change own record fields (throughput, cache_tokens_left, span...), seq += 1, re-sign."""
        bad = set(fields) - (set(record_fields()) - set(_FIXED))
        if bad:
            raise BadRequest(
                f"cannot announce {sorted(bad)}; settable fields: "
                f"{sorted(set(record_fields()) - set(_FIXED))}"
            )
        if "addrs" in fields:
            fields["addrs"] = list(fields["addrs"])
        self._fields.update(fields)
        self._resign()

    def _resign(self) -> None:
        now = self.clock()
        # seq from the wall clock (microseconds) keeps rising across restarts
        self._fields["seq"] = max(int(self._fields["seq"]) + 1, int(now * 1_000_000))
        self._fields["expires_at"] = now + self.config.record_ttl_s
        self.record = sign_record(self.identity, dict(self._fields))
        self._first_seq = self._first_seq or int(self._fields["seq"])

    @property
    def addrs(self) -> list[str]:
        return list(self._fields["addrs"])

    def join_token(self) -> JoinToken:
        """Our token, from the first announced address."""
        if not self.addrs:
            raise RuntimeError("node is not bound yet")
        scheme, _, hostport = self.addrs[0].rstrip("/").rpartition("://")
        host, _, port = hostport.rpartition(":")
        return JoinToken(self.peer_id, host.strip("[]"), int(port), self.config.swarm_key,
                         tls=scheme == "https")  # fmt: skip

    # -- views ------------------------------------------------------------------------
    def live_records(self) -> list[PeerRecord]:
        """Live records of the swarm, our own included when online."""
        out = self.table.live(self.clock())
        if self.record is not None and self.record.state != "offline":
            out.append(self.record)
        return out

    def all_records(self) -> list[PeerRecord]:
        self.table.expire(self.clock())
        own = [self.record] if self.record is not None else []
        return self.table.records() + own

    def swarm_payload(self) -> dict[str, Any]:
        """GET /swarm: every record, and the measured round trip to each peer gossiped with."""
        records = self.all_records()
        known = {r.peer_id for r in records}
        latency = {p: round(ms, 2) for p, ms in self.latency_ms.items() if p in known}
        return {"peer_id": self.peer_id, "records": [r.to_wire() for r in records],
                "latency_ms": latency}  # fmt: skip

    # -- serving gossip ---------------------------------------------------------------
    def handle_gossip(self, data: Any, *, sender: str = "") -> dict[str, Any]:
        """Take a caller's records (admission decides which are trusted now, the caller's own
        record first, each sending address within its share); reply with what the caller
        lacks (or, for `pull: false`, only our own record) plus our identity proof."""
        items, nonce, pull = parse_gossip_body(data, self.config.max_gossip_records)
        caller = data.get("peer_id") if isinstance(data.get("peer_id"), str) else None
        self._ingest(items, sender=sender, caller=caller)
        theirs: dict[str, int] = {}
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("seq"), int):
                pid = item.get("peer_id")
                if isinstance(pid, str):
                    theirs[pid] = max(theirs.get(pid, -1), item["seq"])
        mine = self.all_records() if pull else [self.record] if self.record else []
        reply = [r.to_wire() for r in mine if r.seq > theirs.get(r.peer_id, -1)]
        out: dict[str, Any] = {"peer_id": self.peer_id, "records": reply}
        if nonce is not None:
            out["proof"] = sign_proof(self.identity, nonce)
        return out

    def _ingest(self, items: list[Any], *, proven: tuple[str, str] | None = None,
                sender: str = "", caller: str | None = None) -> None:  # fmt: skip
        """Raw records from gossip into admission; `proven` = (peer id, url) of a peer that just
        proved its id at that url; `sender` the address the records came from and `caller`
        the peer id it claims (its own record is dialled first)."""
        now = self.clock()
        records = self.table.parse_wire(items, skip=self.peer_id)
        self._check_own_echo(items)
        if proven is not None:
            self.admission.prove(*proven)
        self.admission.offer(records, now, sender=sender, caller=caller)
        self._log_conflicts()

    def _check_own_echo(self, items: list[Any]) -> None:
        """A record of our own id signed elsewhere: an earlier run of ours at our addresses
        (outbid it), or another live process on our identity file (say so; never outbid it)."""
        for item in items:
            if not (isinstance(item, dict) and item.get("peer_id") == self.peer_id):
                continue
            seq, addrs = item.get("seq"), item.get("addrs")
            if not isinstance(seq, int) or not isinstance(addrs, list):
                continue
            if self.addrs and set(addrs) != set(self.addrs) and item.get("state") != "offline":
                if seq > self._first_seq:
                    self._warn_twin(addrs)
            elif seq >= int(self._fields["seq"]):
                self._fields["seq"] = seq
                self._resign()

    def _warn_twin(self, addrs: list[Any]) -> None:
        now = self.clock()
        if now - self._twin_warned_at < 30.0:
            return
        self._twin_warned_at = now
        log.error(
            "ANOTHER PROCESS IS USING THIS NODE'S IDENTITY: peer id %s is also signed at %s "
            "(this node is at %s). Peers keep whichever record they saw first; stop one of the "
            "two, or give it its own --identity_path.", self.peer_id,
            ", ".join(map(str, addrs)), ", ".join(self.addrs),
        )  # fmt: skip

    def _log_conflicts(self) -> None:
        for pid, twin in self.table.conflicts.items():
            if pid not in self._conflicts_logged:
                held = self.table.get(pid)
                log.error(
                    "two live records for peer %s: kept %s, refused %s (two processes share "
                    "one identity file?)", pid, held.addrs if held else "-", list(twin.addrs),
                )  # fmt: skip
        self._conflicts_logged = set(self.table.conflicts)

    # -- calling gossip ---------------------------------------------------------------
    async def exchange_with(
        self, url: str, peer_id: str, *, pull: bool = True, records: list[PeerRecord] | None = None
    ) -> None:
        """One exchange with the peer `peer_id` at `url` (raises DriftError): push our table
        (or `records`), pull what we lack (or, without `pull`, only that peer's own record)."""
        assert self.http is not None, "node has no HTTP client (app not started)"
        sent = self.all_records() if records is None else records
        body = {"peer_id": self.peer_id, "records": [r.to_wire() for r in sent],
                "nonce": new_nonce(), "pull": pull}  # fmt: skip
        started = time.perf_counter()
        reply, moved = await exchange(
            self.http,
            url,
            body,
            expect_peer_id=peer_id,
            swarm_key=self.config.swarm_key,
            timeout_s=self.config.request_timeout_s,
            max_records=self.config.max_gossip_records,
        )
        self.bytes_moved += moved
        self.note_latency(peer_id, (time.perf_counter() - started) * 1000)
        self._ingest(reply["records"], proven=(peer_id, url))

    def note_latency(self, peer_id: str, ms: float, weight: float = 0.3) -> None:
        """Fold one measured round trip into the peer's moving average."""
        old = self.latency_ms.get(peer_id)
        self.latency_ms[peer_id] = ms if old is None else old + weight * (ms - old)

    async def join(self, token: JoinToken) -> None:
        """Exchange tables with a seed, which must prove it holds the token's peer id."""
        await self.exchange_with(token.url, token.peer_id)
        self.joined = True
        log.info("joined the swarm through %s", token.to_drift(with_key=False))

    async def _join_any(self) -> None:
        for token in self.config.initial_peers:
            try:
                await self.join(token)
                return
            except DriftError as exc:
                log.warning("cannot join through %s: %s", token.to_drift(with_key=False), exc)

    def _targets(self) -> list[tuple[str, str]]:
        """(url, peer id) to gossip with this round: `fanout` random live peers, plus one
        initial peer when none is among them, so a member never loses touch with its seeds."""
        peers = [r for r in self.table.live(self.clock()) if r.addrs]
        chosen = random.sample(peers, min(self.config.fanout, len(peers)))
        out = [(r.addrs[0], r.peer_id) for r in chosen]
        seeds = [t for t in self.config.initial_peers if t.peer_id != self.peer_id]
        if seeds and not {t.peer_id for t in seeds} & {pid for _, pid in out}:
            token = random.choice(seeds)
            out.append((token.url, token.peer_id))
        return out

    async def dial_pending(self) -> int:
        """Dial every not yet proven address of queued records (open swarms): a peer that
        proves its id at each is trusted, one that fails at any is dropped and not retried
        for a while. Returns #trusted."""
        queued = self.admission.take(self.config.dials_per_round)
        results = await asyncio.gather(*(self._prove_all(r) for r in queued))
        now = self.clock()
        for record, ok in zip(queued, results, strict=True):
            self.admission.dialled(record, ok, now)
        return sum(results)

    async def prove_now(self, record: PeerRecord) -> bool:
        """Whether `record`'s peer proves its id at its addresses, dialled now (a draining
        server needs a replacement before a gossip round would have dialled it)."""
        return await self._prove_all(record)

    async def _prove_all(self, record: PeerRecord) -> bool:
        """Whether the peer proves its id at every address of `record` not proven yet (the
        first dial carries our table, like any exchange; the others only our own record)."""
        for i, addr in enumerate(self.admission.unproven(record)):
            own = None if i == 0 else [self.record] if self.record is not None else []
            try:
                await self.exchange_with(addr, record.peer_id, pull=False, records=own)
            except Exception as exc:  # any failure: not proven (one bad dial stops no round)
                log.debug("%s does not prove its id at %s: %s", record.peer_id, addr, exc)
                return False
        return True

    async def gossip_round(self) -> None:
        """Re-sign our record, drop expired ones, exchange with a few random live peers (and
        a seed), dial records waiting for admission. Waits at most one gossip interval: a
        slow or frozen peer's exchange goes on in the background (never two at once with one
        peer) instead of holding back the next re-signing."""
        self._resign()
        self.table.expire(self.clock())
        if not self.joined and self.config.initial_peers:
            await self._join_any()
        targets = [(url, pid) for url, pid in self._targets() if pid not in self._inflight]
        tasks = [self._spawn(pid, self._exchange_logged(url, pid)) for url, pid in targets]
        tasks.append(self._spawn(None, self.dial_pending()))
        await asyncio.wait(tasks, timeout=self.config.gossip_interval_s)
        self.rounds += 1

    def _spawn(self, peer_id: str | None, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        key = peer_id if peer_id is not None else f"dial-{id(task)}"
        self._inflight[key] = task
        task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        return task

    async def _exchange_logged(self, url: str, peer_id: str) -> None:
        try:
            await self.exchange_with(url, peer_id)
        except DriftError as exc:
            log.debug("gossip with %s failed: %s", peer_id, exc)

    async def cancel_inflight(self) -> None:
        """Stop the exchanges still running in the background (before leaving)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run_gossip(self) -> None:
        """Forever: wait for the port, join, then gossip every interval (jittered)."""
        await self.bound.wait()
        cfg = self.config
        while True:
            try:
                await self.gossip_round()
            except Exception:  # a bad round must never stop the loop
                log.exception("gossip round failed")
            raise_if_cancelling()  # a cancellation a round swallowed still stops the loop
            jitter = random.uniform(-cfg.gossip_jitter, cfg.gossip_jitter)
            await asyncio.sleep(cfg.gossip_interval_s * (1 + jitter))

    async def leave(self) -> None:
        """Push our signed `offline` record to a few peers (initial peers first), who spread it
        by gossip; the cost is the same at any table size (bounded by leave_timeout_s)."""
        if self.record is None or self.http is None:
            return
        targets = [(t.url, t.peer_id) for t in self.config.initial_peers
                   if t.peer_id != self.peer_id]  # fmt: skip
        peers = [r for r in self.table.live(self.clock()) if r.addrs]
        for r in random.sample(peers, min(self.config.leave_fanout, len(peers))):
            if r.peer_id not in {pid for _, pid in targets}:
                targets.append((r.addrs[0], r.peer_id))
        targets = targets[: self.config.leave_fanout]
        self.announce(state="offline")
        if not targets:
            return
        offline = [self.record] if self.record is not None else []
        calls = [self.exchange_with(url, pid, pull=False, records=offline) for url, pid in targets]
        try:
            await wait_for(
                asyncio.gather(*calls, return_exceptions=True), self.config.leave_timeout_s
            )
        except asyncio.TimeoutError:
            log.warning("leave: some peers did not take our offline record in time")
        log.info("left the swarm (offline record sent to %d peers)", len(targets))
