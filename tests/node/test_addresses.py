"""Issue 24, finding 2: addresses are identity.

Every address a record announces is proven (the peer answers with a proof of its id there)
before the record is trusted; an address is scheme://host:port and nothing else; a pushed step
goes only to a proven address of the member it names.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from drift.identity import Identity
from drift.node import start_app
from drift.node.membership import MembershipNode
from drift.server.push import check_member
from drift.swarm import PeerRecord, default_fields, sign_record
from drift.wire.addr import addr_problem
from drift.wire.errors import BadRequest, PushRefused
from drift.wire.push import parse_next
from tests.node.node_helpers import FAST, Nodes, live_ids, wait_for

BAD_ADDRS = [
    "http://127.0.0.1:9/internal/admin?op=wipe&x=",
    "http://127.0.0.1:9?x=1",
    "http://127.0.0.1:9#frag",
    "http://user:pw@127.0.0.1:9",
    "http://127.0.0.1",
    "http://127.0.0.1:0",
    "http://127.0.0.1:65536",
    "ftp://127.0.0.1:9",
    "ws://127.0.0.1:9",
    "127.0.0.1:9",
    "http://[::1:9",
    "http://[nothex]:9",
    "http://exa mple:9",
    "http://127.0.0.1:9 ",
]
GOOD_ADDRS = ["http://127.0.0.1:9", "https://node-1.example.org:31337", "https://[::1]:443"]


def record_fields(addrs: list[str], ident: Identity | None = None) -> tuple[Identity, dict]:
    ident = ident or Identity.generate()
    fields = default_fields(ident.peer_id, addrs, "0.1.0")
    fields.update(seq=int(time.time() * 1e6), expires_at=time.time() + 60)
    return ident, fields


@pytest.mark.parametrize("addr", BAD_ADDRS)
def test_a_record_announces_only_scheme_host_port(addr: str) -> None:
    ident, fields = record_fields(["http://127.0.0.1:1", addr])
    with pytest.raises(BadRequest, match="scheme://host:port"):
        sign_record(ident, fields)
    assert addr_problem(addr) is not None
    with pytest.raises(BadRequest, match="scheme://host:port"):
        parse_next({"next": [{"addr": addr, "peer_id": ident.peer_id, "session_id": "s",
                              "step_id": 1}]})  # fmt: skip


@pytest.mark.parametrize("addr", GOOD_ADDRS)
def test_good_addresses_pass(addr: str) -> None:
    ident, fields = record_fields([addr])
    assert sign_record(ident, fields).addrs == (addr,)
    (hop,) = parse_next({"next": [{"addr": addr, "peer_id": "p", "session_id": "s",
                                   "step_id": 1}]})  # fmt: skip
    assert hop.addr == addr


def test_push_goes_only_to_a_proven_address() -> None:
    """A live member's record announcing a second address: a push to it is refused until the
    member proved its id there."""
    node = MembershipNode(Identity.generate(), FAST)
    ident, fields = record_fields(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    record = sign_record(ident, fields)
    node.table.merge(record, time.time())
    node.admission.prove(ident.peer_id, "http://127.0.0.1:1")
    first, second = parse_next({"next": [
        {"addr": a, "peer_id": ident.peer_id, "session_id": "s", "step_id": 1,
         "push_token": "t"}
        for a in record.addrs]})  # fmt: skip
    check_member(node, first)
    with pytest.raises(PushRefused, match="127.0.0.1:2"):
        check_member(node, second)
    node.admission.prove(ident.peer_id, "http://127.0.0.1:2")
    check_member(node, second)


async def test_every_announced_address_is_proven_before_it_is_trusted(nodes: Nodes) -> None:
    """A real member announces its own address plus a listener of an attacker's choice: the
    seed dials the listener to prove it, which fails, so the record is never trusted and the
    listener sees nothing but that one proof request."""
    paths: list[str] = []

    async def victim(request: web.Request) -> web.Response:
        paths.append(f"{request.method} {request.path_qs}")
        return web.json_response({"error": {"code": "not_found", "message": "x"}}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", victim)
    listener = await start_app(app, "127.0.0.1", 0)
    try:
        seed, _ = await nodes.start()
        member, run = await nodes.start(seed.join_token())
        await wait_for(lambda: member.peer_id in live_ids(seed), 5, "member to join")
        member.announce(addrs=[*member.addrs, f"http://127.0.0.1:{listener.port}"])
        await asyncio.sleep(8 * FAST.gossip_interval_s)
        held = seed.table.get(member.peer_id)
        assert held is not None and len(held.addrs) == 1, (
            f"the seed trusts an unproven address: {held and held.addrs}"
        )
        assert paths and set(paths) == {"POST /swarm/gossip"}, paths
        # a member whose second address proves its id too (it is its own) is trusted there
        other, run = await nodes.start(seed.join_token())
        both = [*other.addrs, f"http://localhost:{run.port}"]
        other.announce(addrs=both)
        await wait_for(lambda: getattr(seed.table.get(other.peer_id), "addrs", ()) == tuple(both),
                       5, "the second, real address to be proven")  # fmt: skip
        assert seed.admission.is_proven(other.peer_id, both[1])
    finally:
        await listener.stop()


def test_fuzzed_record_addresses_never_reach_the_table() -> None:
    ident, fields = record_fields(["http://127.0.0.1:1"])
    wire = sign_record(ident, fields).to_wire()
    for addr in BAD_ADDRS:
        with pytest.raises(BadRequest):
            PeerRecord.from_wire({**wire, "addrs": [addr]})
