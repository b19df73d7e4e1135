"""Issue 16, findings 7 and 8: a private swarm's proof is checked before any body is read,
cannot be replayed (same node, other node, other query, WebSocket handshake), and a silent
connection does not stay open forever."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from drift.wire import messages as m
from drift.wire.auth import auth_headers

KEY = "k3y-of-the-swarm"


async def _status(http, method, url, headers) -> int:
    async with http.request(method, url, headers=headers) as resp:
        await resp.read()
        return resp.status


async def _raw_exchange(port: int, head: bytes, body: bytes, wait_s: float) -> bytes:
    """Send `head` and part of a body; whatever the server answers within `wait_s`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(4096), wait_s)
        except asyncio.TimeoutError:
            return b""
    finally:
        writer.close()


async def test_unauthenticated_body_is_refused_before_it_is_read(servers, tiny_llama):
    """Finding 7: a 60 MiB post without the key is answered 401 after its headers alone."""
    running = await servers(tiny_llama, 0, 2, swarm_key=KEY, max_body_bytes=64 << 20)
    port = running.running.port
    for path in ("/forward", "/swarm/gossip"):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {60 << 20}\r\n\r\n").encode()  # fmt: skip
        answer = await _raw_exchange(port, head, b"x" * 4096, wait_s=3.0)
        assert answer.startswith(b"HTTP/1.1 401"), (path, answer[:200])
    assert running.server.backend  # still serving


async def test_replayed_proofs_are_refused(servers, tiny_llama):
    """Finding 8: a captured X-Drift-Auth works once, on one node, for one query."""
    a = await servers(tiny_llama, 0, 2, swarm_key=KEY)
    b = await servers(tiny_llama, 2, 4, swarm_key=KEY)
    async with aiohttp.ClientSession() as http:
        captured = auth_headers(KEY, "GET", "/swarm", peer_id=a.node.peer_id)
        assert await _status(http, "GET", f"{a.url}/swarm", captured) == 200
        assert await _status(http, "GET", f"{a.url}/swarm", captured) == 403  # replay
        assert await _status(http, "GET", f"{b.url}/swarm", captured) == 403  # other node
        fp = a.server.backend.fingerprint
        captured = auth_headers(KEY, "GET", f"/swarm/coverage?model={fp}", peer_id=a.node.peer_id)
        assert await _status(http, "GET", f"{a.url}/swarm/coverage?model=other", captured) == 403
        fresh = auth_headers(KEY, "GET", f"/swarm/coverage?model={fp}", peer_id=a.node.peer_id)
        assert await _status(http, "GET", f"{a.url}/swarm/coverage?model={fp}", fresh) == 200

        # a replayed WebSocket handshake opens nothing
        handshake = auth_headers(KEY, "GET", "/inference", peer_id=a.node.peer_id)
        ws = await http.ws_connect(f"{a.url}/inference", headers=handshake)
        opened = m.OpenSession(fp, 0, 2, 8, 1, "float32").to_wire()
        await ws.send_str(orjson.dumps(opened).decode())
        assert orjson.loads((await ws.receive()).data)["type"] == "session_opened"
        await ws.close()
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(f"{a.url}/inference", headers=handshake)
        assert info.value.status == 403
        assert not a.server.sessions.sessions


async def test_one_handshake_opens_one_session(servers, tiny_llama):
    """Finding 8: the socket a proof opened serves one session, not a stream of them."""
    a = await servers(tiny_llama, 0, 2, swarm_key=KEY)
    fp = a.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            f"{a.url}/inference", headers=auth_headers(KEY, "GET", "/inference",
                                                       peer_id=a.node.peer_id))  # fmt: skip
        opened = orjson.dumps(m.OpenSession(fp, 0, 2, 8, 1, "float32").to_wire()).decode()
        await ws.send_str(opened)
        assert orjson.loads((await ws.receive()).data)["type"] == "session_opened"
        await ws.send_str(orjson.dumps(m.CloseSession().to_wire()).decode())
        assert orjson.loads((await ws.receive()).data)["type"] == "session_closed"
        await ws.send_str(opened)
        reply = orjson.loads((await ws.receive()).data)
        assert reply["type"] == "error" and "one session" in reply["message"]
        await ws.close()


async def test_silent_websockets_are_closed(servers, tiny_llama):
    """Finding 7: a WebSocket that never opens a session, or whose session goes silent past
    the session timeout, is closed by the server."""
    running = await servers(tiny_llama, 0, 2, session_timeout_s=1.0, node={"idle_timeout_s": 0.5})
    fp = running.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        silent = await http.ws_connect(f"{running.url}/inference")
        msg = await asyncio.wait_for(silent.receive(), 10)  # closed by the server, or a timeout
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        quiet = await http.ws_connect(f"{running.url}/inference")
        await quiet.send_str(orjson.dumps(m.OpenSession(fp, 0, 2, 8, 1, "float32").to_wire())
                             .decode())  # fmt: skip
        assert orjson.loads((await quiet.receive()).data)["type"] == "session_opened"
        msg = await asyncio.wait_for(quiet.receive(), 10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    await asyncio.sleep(0.1)
    assert not running.server.sessions.sessions and not running.server.sockets
