"""Issue 16, findings 1, 2 and 6: gossip that one hostile request cannot break.

A flood of self-signed records of unreachable identities (each choosing a far expiry) must
not push a real server out of the seed's table; a graceful leave costs the same at any table
size; an oversized record is refused and a huge gossip reply is not read past a limit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time

import aiohttp
import orjson
import pytest
from aiohttp import web

from drift.identity import Identity
from drift.node.gossip import exchange, new_nonce
from drift.swarm import canonical_bytes, default_fields, sign_record
from drift.wire.errors import BadRequest, PeerUnavailable
from tests.node.node_helpers import Nodes, live_ids, wait_for

TEN_YEARS = 10 * 365 * 86400.0


def fake_server_record(*, addr: str = "http://127.0.0.1:9", pad: int = 0) -> dict:
    """A validly signed record of a fresh identity claiming every block, far in the future."""
    ident = Identity.generate()
    fields = default_fields(ident.peer_id, [addr], "0.1.0")
    fields.update(role="server", model="tiny", model_fingerprint="f00d", num_blocks=4,
                  start_block=0, end_block=4, dtype="float32", quant="none", throughput=1e9,
                  seq=int(time.time() * 1e6), expires_at=time.time() + TEN_YEARS)  # fmt: skip
    if not pad:
        return sign_record(ident, fields).to_wire()
    fields["model"] = "x" * pad  # signed by hand: sign_record itself refuses an oversized record
    signature = ident.sign(canonical_bytes(fields))
    return {**fields, "signature": base64.b64encode(signature).decode("ascii")}


async def post_gossip(port: int, records: list[dict]) -> int:
    body = orjson.dumps({"peer_id": "attacker", "records": records, "nonce": new_nonce()})
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{port}/swarm/gossip", data=body,
                             headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            await resp.read()
            return resp.status


async def test_membership_flood_cannot_push_a_real_server_out(nodes: Nodes) -> None:
    """Finding 1: 1,000 self-signed unreachable records with a 10-year expiry."""
    seed, seed_run = await nodes.start()
    server, _ = await nodes.start(seed.join_token())
    server.announce(role="server", model="tiny", model_fingerprint="f00d", num_blocks=4,
                    start_block=0, end_block=4, throughput=5.0)  # fmt: skip
    await wait_for(lambda: server.peer_id in live_ids(seed), 5, "server to join")
    flood = [fake_server_record() for _ in range(1000)]
    for i in range(0, len(flood), 250):
        await post_gossip(seed_run.port, flood[i : i + 250])
    fakes = {r["peer_id"] for r in flood}
    await asyncio.sleep(3 * seed.config.record_ttl_s)  # several TTLs of gossip rounds
    seen = live_ids(seed)
    assert server.peer_id in seen, "the real server was pushed out of the seed's table"
    assert not fakes & seen, f"{len(fakes & seen)} unreachable identities are trusted"
    assert not fakes & live_ids(server), "the flood spread to the server"
    assert len(seed.table) <= seed.config.max_records
    # a record's own expiry never outlives the node's TTL
    for record in seed.table.records():
        assert seed.table.deadline(record.peer_id) <= time.time() + seed.config.record_ttl_s


async def test_graceful_leave_costs_the_same_at_any_table_size(nodes: Nodes) -> None:
    """Finding 2: leaving with 300 live peers sends a bounded amount, quickly."""
    received = {"bytes": 0, "posts": 0}

    async def sink(request: web.Request) -> web.Response:
        received["bytes"] += len(await request.read())
        received["posts"] += 1
        return web.json_response({"error": {"code": "not_found", "message": "x"}}, status=404)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/swarm/gossip", sink)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        node, _ = await nodes.start(leave_timeout_s=5.0)
        now = time.time()
        for _ in range(300):
            ident = Identity.generate()
            fields = default_fields(ident.peer_id, [f"http://127.0.0.1:{port}"], "0.1.0")
            fields.update(seq=1, expires_at=now + 60)
            node.table.merge(sign_record(ident, fields), now)
        started = time.monotonic()
        await nodes.stop(node)
        took = time.monotonic() - started
    finally:
        await runner.cleanup()
    assert received["posts"] <= 8, received
    assert received["bytes"] <= 64 * 1024, received
    assert took < 3.0


async def test_oversized_record_is_refused_and_the_server_stays(nodes: Nodes) -> None:
    """Finding 6: a validly signed 5 MiB record must not wedge server -> seed gossip."""
    seed, _ = await nodes.start()
    server, server_run = await nodes.start(seed.join_token(), client_max_size=64 << 20)
    await wait_for(lambda: server.peer_id in live_ids(seed), 5, "server to join")
    big = fake_server_record(addr=f"http://127.0.0.1:{server_run.port}", pad=5 << 20)
    await post_gossip(server_run.port, [big])
    assert big["peer_id"] not in server.table
    await asyncio.sleep(2 * seed.config.record_ttl_s)
    assert server.peer_id in live_ids(seed)
    with pytest.raises(BadRequest, match="bytes"):
        from drift.swarm import PeerRecord

        PeerRecord.from_wire(big)


async def test_gossip_reply_is_read_with_a_limit() -> None:
    """Finding 6: a peer answering gossip with a huge body is refused before it is all read."""

    async def huge(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"records": [')
        chunk = b'"' + b"x" * (1 << 20) + b'",'
        try:
            for _ in range(64):
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    app = web.Application()
    app.router.add_post("/swarm/gossip", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(PeerUnavailable, match="more than"):
                await exchange(http, f"http://127.0.0.1:{port}",
                               {"peer_id": "x", "records": [], "nonce": new_nonce()},
                               expect_peer_id=Identity.generate().peer_id, swarm_key=None,
                               timeout_s=10)  # fmt: skip
    finally:
        await runner.cleanup()


async def test_half_open_sockets_are_closed(nodes: Nodes) -> None:
    """Finding 7: a connection whose request never finishes is closed after the idle timeout."""
    _, running = await nodes.start(idle_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the headers never end
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 30)  # the server closes it (or this times out)
    assert data == b""
    writer.close()


async def test_a_caller_that_resets_mid_body_is_not_our_error(nodes: Nodes, caplog) -> None:
    """A gossip POST whose caller resets the connection half way through its body (a peer
    that timed out, or died) is the caller's doing: no `internal error` traceback is logged,
    and the node goes on answering."""
    import socket

    _, running = await nodes.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    writer.write(
        b"POST /swarm/gossip HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n" + b'{"records": [' + b" " * 1000
    )
    await writer.drain()
    await asyncio.sleep(0.3)  # the handler is reading the body
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.close()  # linger 0: a reset, not a close
    await asyncio.sleep(0.3)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{running.port}/health") as resp:
            assert resp.status == 200
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]


async def test_an_identity_flood_cannot_keep_a_real_newcomer_out(nodes: Nodes) -> None:
    """Issue 24, finding 4: 64 POSTs x 300 fresh self-signed identities from one address
    (127.0.0.2) while a real new server joins from another (127.0.0.1): each address holds
    only its share of the admission queue, and a caller's own record is dialled first, so
    the newcomer is trusted while the flood is still going."""
    seed, seed_run = await nodes.start()
    batches = [[fake_server_record() for _ in range(300)] for _ in range(64)]
    posted = 0

    async def flood() -> None:
        nonlocal posted
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=connector) as http:
            for batch in batches:
                body = orjson.dumps({"peer_id": batch[0]["peer_id"], "records": batch,
                                     "nonce": new_nonce()})  # fmt: skip
                async with http.post(f"http://127.0.0.1:{seed_run.port}/swarm/gossip",
                                     data=body, headers={"Content-Type": "application/json"}
                                     ) as resp:  # fmt: skip
                    await resp.read()
                posted += 1
                await asyncio.sleep(0.05)

    attack = asyncio.create_task(flood())
    try:
        while posted < 8:  # the queue is full of the flood
            await asyncio.sleep(0.05)
        assert seed.admission.dropped["sender_full"] > 0 or len(seed.admission.pending) > 0
        server, _ = await nodes.start(seed.join_token())
        seen_at = None
        while not attack.done():
            if server.peer_id in live_ids(seed):
                seen_at = posted
                break
            await asyncio.sleep(0.05)
        assert seen_at is not None and seen_at < len(batches), (
            "the flood kept the real newcomer out of the seed's table until it ended"
        )
        assert len(seed.admission.per_sender) <= 2
        assert max(seed.admission.per_sender.values(), default=0) <= (
            seed.admission.limits.max_pending_per_sender
        )
    finally:
        attack.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attack
    fakes = {r["peer_id"] for batch in batches for r in batch}
    assert not fakes & live_ids(seed)


async def test_a_dead_address_is_dialled_once_and_the_tls_probe_loads_no_ca_store(
    nodes: Nodes, monkeypatch
) -> None:
    """A flood makes a node dial hundreds of dead addresses: each failure costs that one dial,
    not a TLS probe of the same port as well, nor the system's CA store loaded on the event
    loop (~30 ms each: a 300-record flood stalled a seed's /health for ~0.7 s). A plain
    address of a TLS node still gets its hint, from a probe that loads no CA certificates."""
    import ssl

    import drift.swarm.reader as reader
    from tests.faults.procs import free_port

    probes: list[tuple[str, int]] = []
    real_probe = reader._speaks_tls

    def no_ca_store(*args, **kwargs):
        raise AssertionError("the TLS probe loaded the system's CA certificates")

    async def probe(host: str, port: int) -> bool:
        probes.append((host, port))
        with monkeypatch.context() as patch:
            patch.setattr(ssl.SSLContext, "load_default_certs", no_ca_store)
            return await real_probe(host, port)

    monkeypatch.setattr(reader, "_speaks_tls", probe)
    seed, seed_run = await nodes.start(tls=True)
    async with aiohttp.ClientSession() as http:
        dead = free_port()
        with pytest.raises(PeerUnavailable, match=f"cannot reach http://127.0.0.1:{dead}"):
            await reader.fetch_table(http, f"http://127.0.0.1:{dead}", expect_peer_id=seed.peer_id,
                                     swarm_key=None, timeout_s=5)  # fmt: skip
        assert probes == []
        with pytest.raises(PeerUnavailable, match="speaks TLS"):
            await reader.fetch_table(http, f"http://127.0.0.1:{seed_run.port}",
                                     expect_peer_id=seed.peer_id, swarm_key=None, timeout_s=5)  # fmt: skip
        assert probes == [("127.0.0.1", seed_run.port)]
