"""Inference sessions over real servers agree with the full model: steps, beams, rollback."""

from __future__ import annotations

import aiohttp
import pytest
import torch

from tests.server.reference import head_logits, load_reference
from tests.server.wsclient import RawSession


@pytest.fixture
async def two(servers, tiny_llama):
    return await servers(tiny_llama, 0, 2), await servers(tiny_llama, 2, 4)


async def _chain(sessions, hidden, position, **extra):
    for s in sessions:
        hidden = await s.step(hidden, position, **extra)
    return hidden


def _full_logits(ref, ids):
    with torch.no_grad():
        return ref(ids).logits


async def test_prompt_and_ten_steps_equal_full_model(two, tiny_llama):
    a, b = two
    ref = load_reference(tiny_llama)
    fp = a.server.backend.fingerprint
    ids = torch.randint(0, 256, (1, 5))
    async with aiohttp.ClientSession() as http:
        sessions = [await RawSession.open(http, a.url, fp, 0, 2, max_length=32),
                    await RawSession.open(http, b.url, fp, 2, 4, max_length=32)]  # fmt: skip
        with torch.no_grad():
            out = await _chain(sessions, ref.model.embed_tokens(ids), 0)
        for _ in range(10):
            with torch.no_grad():
                logits = head_logits(ref, out)
            assert torch.allclose(logits, _full_logits(ref, ids)[:, -out.shape[1]:],
                                  atol=1e-5, rtol=1e-4)  # fmt: skip
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # greedy
            ids = torch.cat([ids, nxt], dim=1)
            with torch.no_grad():
                out = await _chain(sessions, ref.model.embed_tokens(nxt), ids.shape[1] - 1)
        with torch.no_grad():
            ref_ids = ref.generate(ids[:, :5], max_new_tokens=10, do_sample=False)
        assert torch.equal(ref_ids[:, :15], ids)
        async with http.get(f"{a.url}/blocks") as resp:
            assert (await resp.json())["active_sessions"] == 1
        for s in sessions:
            await s.close()


async def test_beam_reorder_and_rollback(two, tiny_llama):
    a, b = two
    ref = load_reference(tiny_llama)
    fp = a.server.backend.fingerprint
    ids = torch.randint(0, 256, (2, 4))
    embed = ref.model.embed_tokens
    async with aiohttp.ClientSession() as http:
        sessions = [await RawSession.open(http, a.url, fp, 0, 2, batch_size=2),
                    await RawSession.open(http, b.url, fp, 2, 4, batch_size=2)]  # fmt: skip
        with torch.no_grad():
            await _chain(sessions, embed(ids), 0)
            # beam search: both hypotheses continue from row 1
            hypo = torch.tensor([1, 1])
            new = torch.randint(0, 256, (2, 1))
            out = await _chain(sessions, embed(new), 4, hypo_ids=hypo)
            ids = torch.cat([ids[hypo], new], dim=1)
            assert torch.allclose(head_logits(ref, out), _full_logits(ref, ids)[:, -1:], atol=1e-5)
            # roll back two tokens and take another path
            alt = torch.randint(0, 256, (2, 2))
            out = await _chain(sessions, embed(alt), 3)
            ids = torch.cat([ids[:, :3], alt], dim=1)
            assert torch.allclose(head_logits(ref, out), _full_logits(ref, ids)[:, -2:], atol=1e-5)
        for s in sessions:
            await s.close()
