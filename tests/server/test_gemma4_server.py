"""A Gemma 4 server for blocks [4, 6) (they read the K/V of donors 2 and 3): its extras are
checked at the wire edge with clear errors, a bad step leaves the session as it was, and
its throughput benchmark feeds the blocks what they take."""

from __future__ import annotations

import aiohttp
import pytest
import torch

from drift.client.calls import forward
from drift.client.config import ClientConfig
from drift.client.routing import Hop
from drift.client.transport import SpanSocket
from drift.models.checkpoint import Checkpoint
from drift.models.span import ModelSpan
from drift.server.throughput import measure_throughput
from drift.wire import messages as m
from drift.wire.errors import BadTensor
from drift.wire.extras import concrete
from tests.tiny_models import save_tiny


@pytest.fixture(scope="module")
def tiny_gemma4(tmp_path_factory):
    return save_tiny("gemma4_text", tmp_path_factory.mktemp("tiny") / "gemma4_text")


def _extras(span: ModelSpan, tokens: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    spec = span.extra_spec(4, 6)
    return {
        name: torch.randn(concrete(shape, 1, tokens), generator=gen) for name, shape in spec.inputs
    }


async def test_consumer_span_over_http_and_websocket(servers, tiny_gemma4):
    running = await servers(tiny_gemma4, 4, 6)
    fp = running.server.backend.fingerprint
    local = ModelSpan.load(Checkpoint(tiny_gemma4), 4, 6)
    hop = Hop(running.node.peer_id, running.url, 4, 6)
    config = ClientConfig()
    hidden, extras = torch.randn(1, 5, 64), _extras(local, 5, 0)
    assert sorted(extras) == ["kv.2.k", "kv.2.v", "kv.3.k", "kv.3.v", "per_layer_inputs"]
    async with aiohttp.ClientSession() as http:
        reply = await forward(http, hop, fp, hidden, config, extras=extras)
        want = local.forward(hidden, extras=extras)
        assert torch.allclose(reply.hidden_states, want, atol=1e-6)
        # plain JSON without the extras: a 400 naming what is missing
        body = {"start_block": 4, "end_block": 6, "hidden_states": hidden.tolist()}
        async with http.post(f"{running.url}/forward", json=body) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
        assert error["code"] == "bad_tensor" and "missing tensors" in error["message"]
        assert "kv.2.k" in error["message"]

        open_msg = m.OpenSession(fp, 4, 6, 16, 1, "float32")
        sock = await SpanSocket.open(http, hop, open_msg, config)
        session = local.new_session(batch_size=1, max_length=16)
        first = await sock.step(hidden, 0, extras=extras)
        assert torch.allclose(first.hidden_states, session.step(hidden, extras=extras), atol=1e-5)
        step, step_extras = torch.randn(1, 1, 64), _extras(local, 1, 1)
        bad = dict(step_extras, **{"kv.3.v": torch.randn(1, 2, 1, 15)})
        with pytest.raises(BadTensor, match=r"kv.3.v has shape \[1, 2, 1, 15\]"):
            await sock.step(step, 5, extras=bad)
        second = await sock.step(step, 5, extras=step_extras)  # the session kept its cache
        want = session.step(step, extras=step_extras)
        assert torch.allclose(second.hidden_states, want, atol=1e-5)
        await sock.close()


def test_throughput_benchmark_of_a_gemma4_span(tiny_gemma4):
    span = ModelSpan.load(Checkpoint(tiny_gemma4), 3, 6)
    assert measure_throughput(span, tokens=4, repeats=1) > 0
