"""/forward and /backward on real servers agree with plain transformers (frames and JSON)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
import torch

from drift.wire import messages as m
from tests.server.posts import post
from tests.server.reference import head_logits, load_reference


@pytest.fixture
async def two(servers, tiny_llama):
    a = await servers(tiny_llama, 0, 2)
    b = await servers(tiny_llama, 2, 4)
    return a, b


async def test_forward_through_two_servers_equals_full_model(two, tiny_llama):
    a, b = two
    ref = load_reference(tiny_llama)
    ids = torch.randint(0, 256, (2, 7))
    fp = a.server.backend.fingerprint
    with torch.no_grad():
        expected = ref(ids).logits
        hidden = ref.model.embed_tokens(ids)
    async with aiohttp.ClientSession() as http:
        h1 = await post(
            http, f"{a.url}/forward", m.ForwardRequest(fp, 0, 2, hidden), m.ForwardResponse
        )
        h2 = await post(http, f"{b.url}/forward", m.ForwardRequest(fp, 2, 4, h1.hidden_states),
                        m.ForwardResponse, zstd=True)  # fmt: skip
        # a sub-span of what server b holds
        h3 = await post(http, f"{b.url}/forward", m.ForwardRequest(fp, 2, 3, h1.hidden_states),
                        m.ForwardResponse)  # fmt: skip
        h4 = await post(http, f"{b.url}/forward", m.ForwardRequest(fp, 3, 4, h3.hidden_states),
                        m.ForwardResponse)  # fmt: skip
    with torch.no_grad():
        got = head_logits(ref, h2.hidden_states)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)
    assert torch.allclose(h4.hidden_states, h2.hidden_states, atol=1e-6)


async def test_backward_equals_autograd(two, tiny_llama):
    a, b = two
    ref = load_reference(tiny_llama)
    fp = a.server.backend.fingerprint
    ids = torch.randint(0, 256, (2, 5))
    target = torch.randn(2, 5, 256)
    h0 = ref.model.embed_tokens(ids).detach().requires_grad_(True)
    (ref(inputs_embeds=h0).logits * target).sum().backward()
    async with aiohttp.ClientSession() as http:
        h0d = h0.detach()
        h1 = (await post(http, f"{a.url}/forward", m.ForwardRequest(fp, 0, 2, h0d),
                         m.ForwardResponse)).hidden_states  # fmt: skip
        h2 = (await post(http, f"{b.url}/forward", m.ForwardRequest(fp, 2, 4, h1),
                         m.ForwardResponse)).hidden_states  # fmt: skip
        h2 = h2.requires_grad_(True)
        (head_logits(ref, h2) * target).sum().backward()
        g1 = await post(http, f"{b.url}/backward", m.BackwardRequest(fp, 2, 4, h1, h2.grad),
                        m.BackwardResponse)  # fmt: skip
        g0 = await post(http, f"{a.url}/backward",
                        m.BackwardRequest(fp, 0, 2, h0d, g1.grad_inputs), m.BackwardResponse)  # fmt: skip
    assert g0.grad_prompts is None
    assert torch.allclose(g0.grad_inputs, h0.grad, atol=1e-5, rtol=1e-4)


async def test_plain_json_forward_and_backward(two, tiny_llama):
    a, _ = two
    ref = load_reference(tiny_llama)
    hidden = torch.randn(1, 3, 64)
    with torch.no_grad():
        expected = a.server.backend.span.forward(hidden)
    async with aiohttp.ClientSession() as http:
        body = {"start_block": 0, "end_block": 2, "hidden_states": hidden.tolist()}
        async with http.post(f"{a.url}/forward", json=body) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            got = torch.tensor((await resp.json())["hidden_states"])
        body["grad_outputs"] = torch.ones(1, 3, 64).tolist()
        async with http.post(f"{a.url}/backward", data=orjson.dumps(body),
                             headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            assert resp.status == 200
            reply = await resp.json()
    assert torch.allclose(got, expected, atol=1e-6)
    assert torch.tensor(reply["grad_inputs"]).shape == (1, 3, 64)
    assert reply["grad_prompts"] is None
    del ref


async def test_json_without_content_type_as_curl_sends_it(two):
    """`curl -d '{...}'` declares form encoding; a JSON object body still gets the JSON route."""
    a, _ = two
    hidden = torch.randn(1, 2, 64)
    body = orjson.dumps({"start_block": 0, "end_block": 1, "hidden_states": hidden.tolist()})
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{a.url}/forward", data=body, headers=form) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            got = torch.tensor((await resp.json())["hidden_states"])
        bad = orjson.dumps({"start_block": 0, "end_block": 1, "hidden_states": [[[1.0, 2.0]]]})
        async with http.post(f"{a.url}/forward", data=bad, headers=form) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "bad_tensor"
    with torch.no_grad():
        expected = a.server.backend.span.forward(hidden, end_block=1)
    assert torch.allclose(got, expected, atol=1e-6)


async def test_blocks_describes_the_span(two):
    a, b = two
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{b.url}/blocks") as resp:
            info = await resp.json()
    assert (info["start_block"], info["end_block"], info["num_blocks"]) == (2, 4, 4)
    assert info["dtype"] == "float32" and info["quant"] == "none" and info["state"] == "online"
    assert info["model_fingerprint"] == b.server.backend.fingerprint
    assert info["cache_tokens_total"] == info["cache_tokens_left"] == 8192
    assert info["active_sessions"] == 0 and info["throughput"] == 100.0


async def test_large_body_and_announced_record(servers, tiny_llama):
    running = await servers(tiny_llama, 1, 3, swarm_key="sekret")
    fp = running.server.backend.fingerprint
    record = running.node.record
    assert (record.start_block, record.end_block, record.model_fingerprint) == (1, 3, fp)
    assert record.cache_tokens_left == 8192 and record.throughput == 100.0
    hidden = torch.randn(4, 2000, 64)  # 2 MB, past aiohttp's default body limit
    req = m.ForwardRequest(fp, 1, 3, hidden)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{running.url}/forward", data=m.encode(req)) as resp:
            assert resp.status == 401  # the swarm key gates compute routes
        http.headers["Authorization"] = "Bearer sekret"
        reply = await post(http, f"{running.url}/forward", req, m.ForwardResponse)
    assert torch.allclose(reply.hidden_states, running.server.backend.span.forward(hidden))


async def test_metrics_count_requests_and_steps(two):
    from tests.server.wsclient import RawSession

    a, _ = two
    fp = a.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        sess = await RawSession.open(http, a.url, fp, 0, 2)
        await sess.step(torch.randn(1, 2, 64), 0)
        await post(http, f"{a.url}/forward", m.ForwardRequest(fp, 0, 2, torch.randn(1, 1, 64)),
                   m.ForwardResponse)  # fmt: skip
        async with http.post(f"{a.url}/forward", data=b"junk") as resp:
            assert resp.status == 400
        async with http.get(f"{a.url}/metrics") as resp:
            text = await resp.text()
        await sess.close()
    assert 'drift_requests_total{route="/forward",status="200"} 1' in text
    assert 'drift_requests_total{route="/forward",status="400"} 1' in text
    assert 'drift_requests_total{route="/inference:step",status="200"} 1' in text
    assert "drift_step_latency_seconds_count 1" in text
    assert "drift_active_sessions 1" in text
    assert "drift_cache_tokens_in_use 128" in text  # 64 tokens x 1 x 2 blocks
