"""TLS between nodes: certificates bound to identities, checked against the expected peer id.

A node with another identity behind the right address (a man in the middle) is refused by a
joining node, by the swarm reader, and before any request byte is sent; TLS nodes converge;
records carry https:// addresses.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from drift.identity import Identity, JoinToken, parse_join_token
from drift.identity.tls import (
    BadCertificate,
    certificate_proves,
    make_certificate,
    peer_id_of_certificate,
    server_context,
)
from drift.swarm.reader import read_swarm
from drift.wire.errors import Forbidden, PeerUnavailable
from tests.node.node_helpers import Nodes, live_ids, wait_for


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def test_certificate_proves_its_identity_and_nothing_else() -> None:
    me, other = Identity.generate(), Identity.generate()
    cert, _ = make_certificate(me)
    assert peer_id_of_certificate(_der(cert)) == me.peer_id
    assert certificate_proves(_der(cert), me.peer_id)
    assert not certificate_proves(_der(cert), other.peer_id)
    # a certificate whose key another identity signed: the signature does not cover this key
    forged, _ = make_certificate(other)
    assert not certificate_proves(_der(forged), me.peer_id)
    with pytest.raises(BadCertificate):
        peer_id_of_certificate(b"not a certificate")


async def test_tls_nodes_converge_with_https_records(nodes: Nodes) -> None:
    seed, _ = await nodes.start(tls=True)
    token = seed.join_token()
    assert token.tls and token.url.startswith("https://") and "tls=off" not in str(token)
    assert parse_join_token(str(token)) == token
    a, _ = await nodes.start(token, tls=True)
    b, _ = await nodes.start(token, tls=True)
    everyone = [seed, a, b]
    ids = {n.peer_id for n in everyone}
    await wait_for(lambda: all(live_ids(n) == ids for n in everyone), 10, "TLS nodes to converge")
    assert all(addr.startswith("https://") for r in seed.live_records() for addr in r.addrs)
    snap = await read_swarm([token])
    assert {r.peer_id for r in snap.live()} == ids


async def test_man_in_the_middle_is_refused(nodes: Nodes) -> None:
    """A node with another identity at the address a token names: refused before any
    request byte is sent, by a joining node and by the swarm reader."""
    real, _ = await nodes.start(tls=True)
    impostor, impostor_run = await nodes.start(tls=True)
    forged = JoinToken(real.peer_id, "127.0.0.1", impostor_run.port, tls=True)
    joiner, _ = await nodes.start(tls=True)
    with pytest.raises(Forbidden, match="another identity"):
        await joiner.join(forged)
    with pytest.raises(PeerUnavailable, match="another identity"):
        await read_swarm([forged])
    assert joiner.peer_id not in live_ids(impostor) and real.peer_id not in live_ids(joiner)


async def test_request_bytes_never_reach_a_wrong_peer() -> None:
    """The check runs after the TLS handshake, before the request is written."""
    other = Identity.generate()
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"peer_id": other.peer_id, "records": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(other)).start()
    port = runner.addresses[0][1]
    try:
        expected = Identity.generate().peer_id
        with pytest.raises(PeerUnavailable):
            await read_swarm([JoinToken(expected, "127.0.0.1", port)])
        assert seen == []
        snap = await read_swarm([JoinToken(other.peer_id, "127.0.0.1", port)])
        assert seen == ["/swarm"] and snap.peer_id == other.peer_id
        # a client that skips the check (curl -k) still talks TLS
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/health", ssl=ctx) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientError):
                await asyncio.wait_for(http.get(f"http://127.0.0.1:{port}/health"), 5)
    finally:
        await runner.cleanup()
