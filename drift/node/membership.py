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
from drift.node.config import NodeConfig
from drift.node.gossip import exchange, new_nonce, parse_gossip_body, sign_proof
from drift.swarm import MembershipTable, PeerRecord, default_fields, sign_record
from drift.swarm.record import record_fields
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
        self.table = MembershipTable(identity.peer_id)
        self._fields: dict[str, Any] = default_fields(identity.peer_id, [], config.version)
        self.record: PeerRecord | None = None
        self.port: int | None = None
        self.http: aiohttp.ClientSession | None = None
        self.bound = asyncio.Event()
        self.rounds = 0
        self.bytes_moved = 0
        self.joined = False

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
            addrs = [f"http://{format_hostport(host, port)}"]
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

    def _outbid_own_echo(self, items: list[Any]) -> None:
        """A record of ours with a higher seq (from an earlier run) must not beat our new one."""
        for item in items:
            if isinstance(item, dict) and item.get("peer_id") == self.peer_id:
                seq = item.get("seq")
                if isinstance(seq, int) and seq >= int(self._fields["seq"]):
                    self._fields["seq"] = seq
                    self._resign()

    def _resign(self) -> None:
        now = self.clock()
        # seq from the wall clock (microseconds) keeps rising across restarts
        self._fields["seq"] = max(int(self._fields["seq"]) + 1, int(now * 1_000_000))
        self._fields["expires_at"] = now + self.config.record_ttl_s
        self.record = sign_record(self.identity, dict(self._fields))

    @property
    def addrs(self) -> list[str]:
        return list(self._fields["addrs"])

    def join_token(self) -> JoinToken:
        """Our token, from the first announced address."""
        if not self.addrs:
            raise RuntimeError("node is not bound yet")
        hostport = self.addrs[0].split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        return JoinToken(self.peer_id, host.strip("[]"), int(port), self.config.swarm_key)

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
        return {"peer_id": self.peer_id, "records": [r.to_wire() for r in self.all_records()]}

    # -- serving gossip ---------------------------------------------------------------
    def handle_gossip(self, data: Any) -> dict[str, Any]:
        """Merge a caller's table; reply with what the caller lacks plus our identity proof."""
        caller, items, nonce = parse_gossip_body(data, self.config.max_gossip_records)
        self.table.merge_wire(items, self.clock(), skip=self.peer_id)
        self._outbid_own_echo(items)
        theirs: dict[str, int] = {}
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("seq"), int):
                pid = item.get("peer_id")
                if isinstance(pid, str):
                    theirs[pid] = max(theirs.get(pid, -1), item["seq"])
        reply = [r.to_wire() for r in self.all_records() if r.seq > theirs.get(r.peer_id, -1)]
        out: dict[str, Any] = {"peer_id": self.peer_id, "records": reply}
        if nonce is not None:
            out["proof"] = sign_proof(self.identity, nonce)
        return out

    # -- calling gossip ---------------------------------------------------------------
    async def exchange_with(self, url: str, peer_id: str) -> None:
        """One push-pull exchange with the peer `peer_id` at `url` (raises DriftError)."""
        assert self.http is not None, "node has no HTTP client (app not started)"
        body = {**self.swarm_payload(), "nonce": new_nonce()}
        reply, moved = await exchange(
            self.http,
            url,
            body,
            expect_peer_id=peer_id,
            swarm_key=self.config.swarm_key,
            timeout_s=self.config.request_timeout_s,
        )
        self.bytes_moved += moved
        self.table.merge_wire(reply["records"], self.clock(), skip=self.peer_id)
        self._outbid_own_echo(reply["records"])

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

    async def gossip_round(self) -> None:
        """Re-sign our record, drop expired ones, exchange with a few random live peers."""
        self._resign()
        self.table.expire(self.clock())
        peers = [r for r in self.table.live(self.clock()) if r.addrs]
        if not peers:
            await self._join_any()
            return
        chosen = random.sample(peers, min(self.config.fanout, len(peers)))
        results = await asyncio.gather(
            *(self.exchange_with(r.addrs[0], r.peer_id) for r in chosen), return_exceptions=True
        )
        for r, res in zip(chosen, results, strict=True):
            if isinstance(res, Exception):
                log.debug("gossip with %s failed: %s", r.peer_id, res)
        self.rounds += 1

    async def run_gossip(self) -> None:
        """Forever: wait for the port, join, then gossip every interval (jittered)."""
        await self.bound.wait()
        cfg = self.config
        while True:
            try:
                await self.gossip_round()
            except Exception:  # a bad round must never stop the loop
                log.exception("gossip round failed")
            jitter = random.uniform(-cfg.gossip_jitter, cfg.gossip_jitter)
            await asyncio.sleep(cfg.gossip_interval_s * (1 + jitter))

    async def leave(self) -> None:
        """Publish a signed `offline` record to every live peer (bounded by leave_timeout_s)."""
        if self.record is None or self.http is None:
            return
        peers = [r for r in self.table.live(self.clock()) if r.addrs]
        self.announce(state="offline")
        if not peers:
            return
        calls = [self.exchange_with(r.addrs[0], r.peer_id) for r in peers]
        try:
            await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), self.config.leave_timeout_s
            )
        except asyncio.TimeoutError:
            log.warning("leave: some peers did not take our offline record in time")
        log.info("left the swarm (offline record sent to %d peers)", len(peers))
