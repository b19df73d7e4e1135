"""Reading a swarm's membership table from its members: the one reader of the SDK and the CLI.

`fetch_table` GETs `/swarm` from one node and checks it is the peer expected;
`read_swarm` asks each initial peer in turn and keeps what verifies (the same
`MembershipTable.merge` nodes use: signature, seq, expiry) as a `SwarmSnapshot`.
Requests carry the swarm key's HMAC (drift.wire.auth), never the key itself.
`dial_failure` turns a failed connection into one line saying what to do (a TLS address
against a plain node, or the reverse, names the address to write instead).
The only module of drift/swarm that does I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from drift.identity import JoinToken, format_hostport
from drift.identity.swarm_key import resolve_swarm_key
from drift.swarm.coverage import Coverage, all_coverages
from drift.swarm.dial import is_wrong_peer, peer_ssl
from drift.swarm.record import PeerRecord
from drift.swarm.table import MembershipTable
from drift.waits import wait_for
from drift.wire.auth import auth_headers, check_reply
from drift.wire.errors import (
    BadRequest,
    DriftError,
    Forbidden,
    PeerUnavailable,
    Unauthorized,
    from_payload,
)

SWARM_PATH = "/swarm"
MAX_TABLE_BYTES = 64 << 20  # a /swarm reply larger than this is refused


@dataclass(frozen=True)
class TableReply:
    """One node's answer to GET /swarm."""

    peer_id: str  # the answering node (checked against the one expected)
    records: list[Any]  # raw records, not yet verified
    seconds: float  # round trip


async def fetch_table(
    http: aiohttp.ClientSession, url: str, *, expect_peer_id: str,
    swarm_key: str | None, timeout_s: float, connect_timeout_s: float | None = None,
) -> TableReply:  # fmt: skip
    """GET `url`/swarm; PeerUnavailable for network faults or the wrong peer, Unauthorized /
    Forbidden (with what to do) when a private swarm refuses the key, Forbidden when the
    answer does not prove the key (in a private swarm only key holders' records count)."""
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
    sent = auth_headers(swarm_key, "GET", SWARM_PATH, peer_id=expect_peer_id)
    try:
        async with http.get(url.rstrip("/") + SWARM_PATH, timeout=timeout, headers=sent,
                            ssl=peer_ssl(expect_peer_id)) as resp:  # fmt: skip
            body = await read_limited(resp, MAX_TABLE_BYTES)
            status = resp.status
            headers = resp.headers
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise PeerUnavailable(await dial_failure(exc, url, expect_peer_id)) from exc
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if status in (401, 403):
        raise _auth_error(url, status, data, swarm_key)
    if status != 200:
        raise from_payload(data, status)
    check_reply(swarm_key, sent, status, headers, body, what=f"{url}{SWARM_PATH}")
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise PeerUnavailable(f"{url}{SWARM_PATH} answered without a records list")
    peer_id = data.get("peer_id")
    if peer_id != expect_peer_id:
        raise PeerUnavailable(f"the node at {url} is {peer_id!r}, not {expect_peer_id!r}")
    return TableReply(str(peer_id), data["records"], time.monotonic() - started)


PROBE_TIMEOUT_S = 3.0  # a TLS handshake tried to explain a failed plain-HTTP request, seconds


async def dial_failure(exc: BaseException, url: str, peer_id: str) -> str:
    """One line for a request to `url` (peer `peer_id`) that failed with `exc`: a scheme
    mismatch names the address to write instead, never an SSL repr."""
    parsed = URL(url)
    host, port = parsed.host or "", parsed.port or 0
    where = format_hostport(host, port)
    if is_wrong_peer(exc):
        return f"the node at {where} is not {peer_id}: its TLS certificate proves another identity"
    if parsed.scheme == "https" and isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        plain = JoinToken(peer_id, host, port, tls=False)
        return (f"the node at {where} does not speak TLS (started with --plain_http?), but the "
                f"address asks for TLS: write it as {plain} (multiaddr {plain.to_multiaddr()}), "
                "or restart that node without --plain_http")  # fmt: skip
    # a TLS node hangs up on plain HTTP once connected; where nothing accepted the connection
    # (ClientConnectorError: refused, unreachable) a TLS handshake there would fail the same
    refused = isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError) and not (
        isinstance(exc, aiohttp.ClientConnectorError)
    )
    if parsed.scheme == "http" and refused and await _speaks_tls(host, port):
        tls = JoinToken(peer_id, host, port)
        return (
            f"the node at {where} speaks TLS (the default), but the address says plain "
            f"HTTP (?tls=off or /http): write it as {tls} (multiaddr {tls.to_multiaddr()})"
        )
    return f"cannot reach {url}: {_why(exc)}"


def _why(exc: BaseException) -> str:
    """What went wrong, in words (an OSError's strerror, not a repr)."""
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the node closed the connection without answering"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return str(exc.os_error.strerror or exc.os_error)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


async def _speaks_tls(host: str, port: int) -> bool:
    """True when a TLS handshake with host:port succeeds (no certificate check: only asking
    whether it speaks TLS; nothing is sent after the handshake). The context loads no CA
    certificates: `ssl.create_default_context()` reads the system's (~30 ms of the event loop
    each, so a flood of records at dead addresses stalled a seed for most of a second)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await wait_for(
            asyncio.open_connection(host, port, ssl=context), PROBE_TIMEOUT_S
        )
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        return False
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return True


async def read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The reply body, refused (PeerUnavailable) past `limit` bytes before it is all read."""
    chunks, size = [], 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise PeerUnavailable(f"{resp.url} answered more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _auth_error(url: str, status: int, data: Any, swarm_key: str | None) -> DriftError:
    """Unauthorized / Forbidden naming the node, its words and the fix."""
    said = from_payload(data, status).message
    if swarm_key:
        return Forbidden(f"{url} refused: {said} (the swarm_key given does not match this "
                         "swarm's key)")  # fmt: skip
    return Unauthorized(f"{url} refused: {said} (this swarm is private: pass swarm_key=... or "
                        "--swarm_key, or a join token with ?key=...)")  # fmt: skip


@dataclass(frozen=True)
class SwarmSnapshot:
    """The verified table one member gave: newest unexpired record of every peer."""

    url: str  # where it was read
    peer_id: str  # who answered
    records: tuple[PeerRecord, ...]  # verified, online and offline
    rejected: int  # records that did not verify (forged, stale, expired, malformed)

    def live(self) -> list[PeerRecord]:
        return [r for r in self.records if r.state != "offline"]

    def coverages(self, model: str | None = None) -> list[Coverage]:
        """Coverage of `model`, or of every model served."""
        return all_coverages(list(self.records), model)


def snapshot(url: str, reply: TableReply, now: float) -> SwarmSnapshot:
    table = MembershipTable()
    table.merge_wire(reply.records, now)
    return SwarmSnapshot(url, reply.peer_id, tuple(table.records()), sum(table.rejected.values()))


async def read_swarm(
    tokens: Sequence[JoinToken], *, swarm_key: str | None = None, timeout_s: float = 10.0,
    http: aiohttp.ClientSession | None = None,
) -> SwarmSnapshot:  # fmt: skip
    """Ask each initial peer in turn; the first that answers gives the snapshot. The key
    proved: drift.identity.swarm_key.resolve_swarm_key(swarm_key, tokens=tokens)."""
    if not tokens:
        raise BadRequest("no initial peers given; pass a join token drift://...")
    own = http is None
    session = http or aiohttp.ClientSession()
    errors: list[str] = []
    key = resolve_swarm_key(swarm_key, tokens=tokens)
    try:
        for token in tokens:
            try:
                reply = await fetch_table(session, token.url, expect_peer_id=token.peer_id,
                                          swarm_key=key, timeout_s=timeout_s)  # fmt: skip
            except (Unauthorized, Forbidden):
                raise
            except DriftError as exc:
                errors.append(f"{token.to_drift(with_key=False)}: {exc.message}")
                continue
            return snapshot(token.url, reply, time.time())
    finally:
        if own:
            await session.close()
    raise PeerUnavailable("no initial peer answered: " + "; ".join(errors))


def read_swarm_blocking(tokens: Sequence[JoinToken], **kwargs: Any) -> SwarmSnapshot:
    """`read_swarm` for synchronous commands (runs its own event loop)."""
    return asyncio.run(read_swarm(tokens, **kwargs))
