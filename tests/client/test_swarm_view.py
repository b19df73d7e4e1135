"""Forged, altered, replayed and expired records never reach the client's picture of the swarm.

A real aiohttp app on 127.0.0.1 plays a member that serves a doctored GET /swarm: genuine
records mixed with one whose field was altered under its signature, one signed by another key,
an older-seq replay and an expired one. SwarmView (the SDK's path) and read_swarm (the CLI's
path) go through drift/swarm/reader.py and MembershipTable.merge_wire, as nodes do: they keep
only the genuine newest records and count each rejection by reason.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from drift.client.bans import BanList
from drift.client.config import ClientConfig
from drift.client.swarm_view import SwarmView
from drift.identity import Identity, JoinToken
from drift.node import start_app
from drift.swarm import PeerRecord
from drift.swarm.reader import read_swarm
from drift.swarm.record import canonical_bytes
from tests.swarm.swarm_helpers import make_record

FP = "f00d"  # make_record's model fingerprint


class DoctoredMember:
    """Answers GET /swarm with `records` (raw wire dicts, as given) as peer `identity`."""

    def __init__(self) -> None:
        self.identity = Identity.generate()
        self.records: list[Any] = []
        self.token = JoinToken(self.identity.peer_id, "127.0.0.1", 0, tls=False)  # plain HTTP
        self.reads = 0  # GET /swarm answered (or held)
        self.hold: asyncio.Event | None = None  # set: reads wait for it

    async def swarm(self, request: web.Request) -> web.Response:
        self.reads += 1
        if self.hold is not None:
            await self.hold.wait()
        return web.json_response({"peer_id": self.identity.peer_id, "records": self.records})


@pytest.fixture
async def member() -> AsyncIterator[DoctoredMember]:
    doctored = DoctoredMember()
    app = web.Application()
    app.router.add_get("/swarm", doctored.swarm)
    running = await start_app(app, "127.0.0.1", 0)
    doctored.token = dataclasses.replace(doctored.token, port=running.port)
    try:
        yield doctored
    finally:
        await running.stop()


@dataclasses.dataclass
class Table:
    own: PeerRecord  # the member's own record, genuine
    newest: PeerRecord  # another server's newest genuine record
    replayed: PeerRecord  # that server's older record, genuinely signed, replayed
    altered: PeerRecord  # own with a higher seq and throughput, signature kept
    wrong_key: PeerRecord  # own's peer id, higher seq, signed by an attacker's key
    expired: PeerRecord  # a third server's genuine record, past expires_at

    def served(self) -> list[dict[str, Any]]:
        bad_first = [self.altered, self.wrong_key, self.own, self.newest, self.replayed]
        return [r.to_wire() for r in bad_first + [self.expired]]

    def genuine(self) -> dict[str, PeerRecord]:
        return {self.own.peer_id: self.own, self.newest.peer_id: self.newest}


def doctored_table(member: DoctoredMember) -> Table:
    now, url = time.time(), member.token.url
    fresh: dict[str, Any] = dict(num_blocks=4, expires_at=now + 60, addrs=[url])
    other = Identity.generate()
    own = make_record(member.identity, span=(0, 2), seq=7, throughput=10.0, **fresh)
    fields = own.fields() | {"seq": 9, "end_block": 4, "throughput": 500.0}
    forged_sig = base64.b64encode(Identity.generate().sign(canonical_bytes(fields))).decode()
    return Table(
        own=own,
        newest=make_record(other, span=(2, 4), seq=5, throughput=20.0, **fresh),
        replayed=make_record(other, span=(2, 4), seq=4, throughput=50.0, **fresh),
        altered=dataclasses.replace(own, seq=8, throughput=999.0),
        wrong_key=PeerRecord.from_wire(fields | {"signature": forged_sig}),
        expired=make_record(
            span=(0, 4), seq=1, throughput=70.0, **(fresh | {"expires_at": now - 1})
        ),
    )


def by_peer(records: Any) -> dict[str, PeerRecord]:
    return {r.peer_id: r for r in records}


async def test_swarm_view_keeps_only_genuine_newest_records(member: DoctoredMember) -> None:
    table = doctored_table(member)
    member.records = table.served()
    async with aiohttp.ClientSession() as http:
        view = SwarmView((member.token,), ClientConfig(), http, BanList(1.0, 10.0))
        await view.refresh(force=True)
        assert by_peer(view.table.records()) == table.genuine()
        assert view.table.rejected == Counter(bad_signature=2, stale=1, expired=1)
        routes = {(s.peer_id, s.start_block, s.end_block, s.throughput) for s in view.servers(FP)}
        assert routes == {(table.own.peer_id, 0, 2, 10.0), (table.newest.peer_id, 2, 4, 20.0)}

        # later the member serves only the replay and the forgeries: the view keeps the newest
        member.records = [r.to_wire() for r in (table.replayed, table.altered, table.wrong_key)]
        await view.refresh(force=True)
        assert by_peer(view.table.records()) == table.genuine()
        assert view.table.rejected == Counter(bad_signature=4, stale=2, expired=1)


async def test_read_swarm_keeps_only_genuine_newest_records(member: DoctoredMember) -> None:
    table = doctored_table(member)
    member.records = table.served() + [{"peer_id": 1}, "not a record"]
    snap = await read_swarm([member.token])
    assert snap.peer_id == member.identity.peer_id
    assert by_peer(snap.records) == table.genuine()
    assert snap.rejected == 6  # 2 bad signatures, 1 stale, 1 expired, 2 malformed
    [cov] = snap.coverages(FP)
    assert cov.missing == () and [b.throughput for b in cov.blocks] == [10.0, 10.0, 20.0, 20.0]


def test_a_refused_connection_is_told_apart_from_a_slow_peer() -> None:
    from drift.client.bans import BanList
    from drift.client.remote import refused
    from drift.wire.errors import PeerUnavailable

    def raised(cause: BaseException) -> PeerUnavailable:
        try:
            raise PeerUnavailable("peer at http://127.0.0.1:9") from cause
        except PeerUnavailable as exc:
            return exc

    assert refused(raised(ConnectionRefusedError(111, "refused")))
    assert not refused(raised(asyncio.TimeoutError()))
    assert not refused(PeerUnavailable("no cause"))
    bans = BanList(1.0, 8.0, clock=lambda: 0.0)
    bans.ban("slow")
    bans.ban("slow")
    assert bans.worth_waiting_for("slow")  # timed out twice: still there
    bans.ban("gone", unreachable=True)
    assert bans.worth_waiting_for("gone")  # once: a blip (a restart, say)
    bans.ban("gone", unreachable=True)
    assert not bans.worth_waiting_for("gone")  # refused again and again
    bans.success("gone")
    assert bans.worth_waiting_for("gone") and bans.failures("gone") == 0


async def test_a_new_sessions_route_never_waits_for_a_table_it_has(member: DoctoredMember) -> None:
    """fresh_enough reads the table where there is none; past swarm_refresh_s it routes with
    the one at hand and reads again in the background (one read at a time), the new
    records there for the next route."""
    table = doctored_table(member)
    member.records = [table.own.to_wire()]
    async with aiohttp.ClientSession() as http:
        view = SwarmView((member.token,), ClientConfig(swarm_refresh_s=0.05), http,
                         BanList(1.0, 10.0))  # fmt: skip
        await view.fresh_enough()  # none yet: read now
        assert member.reads == 1 and set(by_peer(view.table.records())) == {table.own.peer_id}
        await view.fresh_enough()  # fresh: nothing read
        assert member.reads == 1
        await asyncio.sleep(0.06)
        member.records = [r.to_wire() for r in (table.own, table.newest)]
        member.hold = asyncio.Event()
        await asyncio.wait_for(view.fresh_enough(), 1)  # stale: not waited for
        await asyncio.wait_for(view.fresh_enough(), 1)  # one read under way: no second
        while member.reads < 2:
            await asyncio.sleep(0.01)
        assert set(by_peer(view.table.records())) == {table.own.peer_id}
        member.hold.set()
        await asyncio.wait_for(view._reading, 5)  # type: ignore[arg-type]
        assert member.reads == 2 and by_peer(view.table.records()) == table.genuine()
