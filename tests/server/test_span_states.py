"""Spans give each block's output when asked (/forward, inference steps, plain JSON), equal
to transformers' per-layer hidden states; frames that do not ask get none."""

from __future__ import annotations

import aiohttp
import pytest
import torch

from drift.wire import messages as m
from drift.wire.extras import BLOCK_STATES
from drift.wire.frames import MEDIA_TYPE
from tests.server.reference import load_reference
from tests.server.wsclient import RawSession


@pytest.fixture
async def two(servers, tiny_llama):
    return await servers(tiny_llama, 0, 2), await servers(tiny_llama, 2, 4)


async def _post(http, url, message, **expect):
    async with http.post(url, data=m.encode(message), headers={"Content-Type": MEDIA_TYPE}) as r:
        data = await r.read()
        assert r.status == 200, data[:300]
        return m.decode(m.ForwardResponse, data, **expect)


async def test_forward_and_steps_give_each_block_output(two, tiny_llama):
    a, b = two
    ref = load_reference(tiny_llama)
    fp = a.server.backend.fingerprint
    ids = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids, output_hidden_states=True).hidden_states  # embeds, blocks 0..2, normed
        hidden = ref.model.embed_tokens(ids)
    async with aiohttp.ClientSession() as http:
        first = await _post(http, f"{a.url}/forward", m.ForwardRequest(fp, 0, 2, hidden,
                                                                       block_states=True), states=2)  # fmt: skip
        plain = await _post(http, f"{a.url}/forward", m.ForwardRequest(fp, 0, 2, hidden))
        assert BLOCK_STATES not in plain.extras
        states = first.extras[BLOCK_STATES]  # [B, T, 2, H]
        for k in range(2):
            assert (states[:, :, k] - want[k + 1]).abs().max() < 1e-5
        assert torch.equal(states[:, :, -1], first.hidden_states)
        sessions = [await RawSession.open(http, a.url, fp, 0, 2, batch_size=2),
                    await RawSession.open(http, b.url, fp, 2, 4, batch_size=2)]  # fmt: skip
        out = hidden[:, :3]
        got = []
        for s in sessions:
            step_id = await s.send_step(out, 0, block_states=True)
            reply = m.decode(m.StepResponse, (await s.ws.receive()).data, states=2)
            assert reply.step_id == step_id
            got.append(reply.extras[BLOCK_STATES])
            out = reply.hidden_states
        per_block = torch.cat(got, dim=2)  # [B, 3, 4, H]
        for k in range(3):
            assert (per_block[:, :, k] - want[k + 1][:, :3]).abs().max() < 1e-5
        # a later step without the flag: no states, the cache continued
        nxt = hidden[:, 3:]
        for s in sessions:
            nxt = await s.step(nxt, 3)
        for s in sessions:
            await s.close()


async def test_plain_json_forward_with_states(two):
    a, _ = two
    async with aiohttp.ClientSession() as http:
        body = {"start_block": 0, "end_block": 2, "hidden_states": [[[0.1] * 64] * 3],
                "block_states": True}  # fmt: skip
        async with http.post(f"{a.url}/forward", json=body) as resp:
            assert resp.status == 200
            data = await resp.json()
        assert torch.tensor(data[BLOCK_STATES]).shape == (1, 3, 2, 64)
        body["block_states"] = "yes"
        async with http.post(f"{a.url}/forward", json=body) as resp:
            assert resp.status == 400
            assert "block_states" in (await resp.json())["error"]["message"]
