"""The client SDK's transport and calls (drift.client) against a real server: same results."""

from __future__ import annotations

import aiohttp
import orjson
import torch

from drift.client.calls import forward
from drift.client.config import ClientConfig
from drift.client.routing import Hop
from drift.client.transport import SpanSocket
from drift.wire import messages as m
from drift.wire.errors import LengthExceeded


async def test_client_transport_round_trip(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)
    fp, span = running.server.backend.fingerprint, running.server.backend.span
    hop = Hop(running.node.peer_id, running.url, 0, 2)
    config = ClientConfig(compress_min_bytes=1)  # exercise Content-Encoding: zstd
    hidden = torch.randn(2, 5, 64)
    async with aiohttp.ClientSession() as http:
        out = (await forward(http, hop, fp, hidden, config)).hidden_states
        assert torch.allclose(out, span.forward(hidden), atol=1e-6)
        sock = await SpanSocket.open(http, hop, m.OpenSession(fp, 0, 2, 8, 2, "float32"), config)
        first = (await sock.step(hidden, 0)).hidden_states
        assert torch.allclose(first, span.forward(hidden), atol=1e-5)
        try:
            await sock.step(torch.randn(2, 4, 64), 5)
            raise AssertionError("a step past max_length must fail")
        except LengthExceeded:
            pass
        await sock.ws.send_str(orjson.dumps(m.CloseSession().to_wire()).decode())
        assert orjson.loads((await sock.ws.receive()).data)["type"] == "session_closed"
        await sock.close()
    assert running.server.budget.used == 0


async def test_compute_status_says_whether_a_session_has_a_step_here(servers, tiny_llama):
    """GET /compute (drift.wire.progress) on a real server in a private swarm: signed
    requests only; `pending` while the session's step, or a named /forward, waits behind a
    unit of other work."""
    import asyncio
    import threading

    from drift.client.calls import compute_status
    from drift.wire.errors import DriftError

    key = "compute-status-test-key"
    running = await servers(tiny_llama, 0, 2, swarm_key=key)
    backend = running.server.backend
    hop = Hop(running.node.peer_id, running.url, 0, 2)
    config = ClientConfig(swarm_key=key)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/compute") as resp:  # unsigned: refused
            assert resp.status == 401, await resp.text()
        try:
            await compute_status(http, hop, ClientConfig(swarm_key="another key"), session_id="x")
            raise AssertionError("a wrong swarm key must be refused")
        except DriftError as exc:
            assert exc.status == 403  # wrong swarm key (HMAC mismatch)
        sock = await SpanSocket.open(
            http, hop, m.OpenSession(backend.fingerprint, 0, 2, 8, 1, "float32"), config
        )
        idle = await compute_status(http, hop, config, session_id=sock.session_id)
        assert (idle.running_s, idle.waiting, idle.pending) == (0.0, 0, False)
        assert idle.unit_s is not None and idle.unit_s > 0
        release = threading.Event()
        blocker = backend.executor.submit(release.wait, 30)  # other work holds the thread
        try:
            step = asyncio.ensure_future(sock.step(torch.randn(1, 3, 64), 0))
            await asyncio.sleep(0.3)
            busy = await compute_status(http, hop, config, session_id=sock.session_id)
            assert busy.pending and busy.running_s >= 0.25 and busy.waiting >= 1
            other = await compute_status(http, hop, config, session_id="no-such-session")
            assert not other.pending
            # a session opens meanwhile: its fresh cache is not queued behind the compute
            opened = await asyncio.wait_for(SpanSocket.open(http, hop, m.OpenSession(
                backend.fingerprint, 0, 2, 8, 1, "float32"), config), 2.0)  # fmt: skip
            await opened.close()
            call = asyncio.ensure_future(forward(http, hop, backend.fingerprint,
                                                 torch.randn(1, 3, 64), config, call_id="c1"))  # fmt: skip
            await asyncio.sleep(0.3)
            assert (await compute_status(http, hop, config, call_id="c1")).pending
            assert not (await compute_status(http, hop, config, call_id="c2")).pending
        finally:
            release.set()
        await asyncio.wait_for(step, 10)
        await asyncio.wait_for(call, 10)
        assert not (await compute_status(http, hop, config, call_id="c1")).pending
        blocker.result(10)
        done = await compute_status(http, hop, config, session_id=sock.session_id)
        assert not done.pending and done.running_s == 0.0
        await sock.close()
