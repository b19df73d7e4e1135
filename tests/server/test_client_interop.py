"""The client SDK's transport (drift.client.transport) against a real server: same results."""

from __future__ import annotations

import aiohttp
import orjson
import torch

from drift.client.config import ClientConfig
from drift.client.routing import Hop
from drift.client.transport import SpanSocket, forward
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
