"""The client's picture of the swarm: verified records read from any reachable peer.

It starts from the initial peers (join tokens or multiaddrs), reads GET /swarm from the
first that answers (and really holds the peer id its token names), keeps every verified
record, refreshes at most every `swarm_refresh_s`, and later reads from any live record's
address, so losing the first peer costs nothing. It measures round trips for routing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from drift.client.bans import BanList
from drift.client.config import ClientConfig
from drift.client.latency import LatencyEwma
from drift.client.records import merge_records, server_infos
from drift.client.routing import ServerInfo
from drift.identity.tokens import JoinToken
from drift.node.auth import auth_headers
from drift.wire.errors import DriftError, Forbidden, PeerUnavailable, Unauthorized, from_payload


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
        self.records: dict[str, dict[str, Any]] = {}
        self.latency = LatencyEwma()
        self.rejected = 0
        self._last_refresh = 0.0
        self._lock = asyncio.Lock()

    def swarm_key_for(self, token: JoinToken | None = None) -> str | None:
        if self.config.swarm_key:
            return self.config.swarm_key
        keys = [t.swarm_key for t in self.initial_peers if t.swarm_key]
        return keys[0] if keys else None

    @property
    def headers(self) -> dict[str, str]:
        """Extra headers for every request; the swarm-key proof is added per request."""
        return {}

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self.config.request_timeout_s, connect=self.config.connect_timeout_s
        )

    def _sources(self) -> list[tuple[str, str | None]]:
        """(url, expected peer id) to read the table from: live records first, then seeds."""
        out: list[tuple[str, str | None]] = []
        for r in self.records.values():
            if (
                r.get("state") == "online"
                and r.get("addrs")
                and not self.bans.is_banned(r["peer_id"])
            ):
                out.append((str(r["addrs"][0]).rstrip("/"), r["peer_id"]))
        out += [(t.url, t.peer_id) for t in self.initial_peers]
        return out

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            if not force and time.monotonic() - self._last_refresh < self.config.swarm_refresh_s:
                return
            errors = []
            for url, peer_id in self._sources():
                try:
                    await self._read_from(url, peer_id)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    errors.append(f"{url}: {exc!r}")
                    continue
                self._last_refresh = time.monotonic()
                return
            raise PeerUnavailable(
                "could not read the swarm table from any peer: " + "; ".join(errors[:5])
            )

    async def _read_from(self, url: str, peer_id: str | None) -> None:
        started = time.monotonic()
        async with self.http.get(
            f"{url}/swarm",
            headers=auth_headers(self.swarm_key_for(), "GET", "/swarm"),
            timeout=self._timeout(),
        ) as resp:
            if resp.status in (401, 403):
                raise self._auth_error(url, resp.status, await resp.read())
            if resp.status != 200:
                raise ValueError(f"GET /swarm answered HTTP {resp.status}")
            body = orjson.loads(await resp.read())
        if peer_id is not None and body.get("peer_id") != peer_id:
            raise ValueError(f"peer at {url} is {body.get('peer_id')!r}, not {peer_id!r}")
        if peer_id is not None:
            self.note_rtt(peer_id, time.monotonic() - started)
        records = body.get("records")
        if not isinstance(records, list):
            raise ValueError("GET /swarm reply has no records list")
        self.rejected += merge_records(self.records, records)

    def _auth_error(self, url: str, status: int, body: bytes) -> DriftError:
        """Unauthorized / Forbidden naming the peer, the server's words and the fix."""
        try:
            said = from_payload(orjson.loads(body), status).message
        except orjson.JSONDecodeError:
            said = body[:200].decode(errors="replace")
        if self.swarm_key_for():
            hint = "the swarm_key given does not match this swarm's key"
            return Forbidden(f"{url} refused the client: {said} ({hint})")
        hint = "this swarm is private: pass swarm_key=... (or a join token with ?key=...)"
        return Unauthorized(f"{url} refused the client: {said} ({hint})")

    @property
    def rtt_s(self) -> dict[str, float]:
        return self.latency.values

    def note_rtt(self, peer_id: str, seconds: float) -> None:
        """One measured round trip (a /swarm read or an inference step on that peer)."""
        self.latency.update(peer_id, seconds)

    def servers(self, model_fingerprint: str) -> list[ServerInfo]:
        """Live, verified, not banned servers of this model, with measured round trips."""
        banned = self.bans.banned()
        out = []
        for s in server_infos(self.records, model_fingerprint):
            if s.peer_id in banned:
                continue
            out.append(
                ServerInfo(
                    s.peer_id,
                    s.addr,
                    s.start_block,
                    s.end_block,
                    s.throughput,
                    s.cache_tokens_left,
                    self.rtt_s.get(s.peer_id),
                )
            )
        return out

    def num_blocks(self, model_fingerprint: str) -> int | None:
        for r in self.records.values():
            if r.get("model_fingerprint") == model_fingerprint and r.get("num_blocks"):
                return int(r["num_blocks"])
        return None
