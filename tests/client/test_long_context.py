"""Long contexts: a prompt crosses each server once, and a session grows without replay.

Counted through each server's /metrics (drift_tokens_total: tokens through its span): after
a long prompt's prefill each server has computed exactly the prompt, also when its KV-cache
budget holds the session only a few times over; a session that outgrows the length it
opened with is grown in place (drift.wire.extend), so the servers compute each token once,
and its logits stay local transformers' (1e-4, float32) with the same greedy tokens. A span
whose server refuses to grow is reopened elsewhere and replayed, alone.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from drift.client import ClientConfig
from tests.server.harness import tokens_total
from tests.server.reference import load_reference

pytestmark = pytest.mark.timeout(300)
TOL = 1e-4


async def _tokens_total(swarm) -> list[int]:
    """Each server's drift_tokens_total, read from its /metrics."""
    return [await tokens_total(running.url) for running in swarm.servers]


def _greedy(new: int) -> dict:
    return dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)


async def test_a_long_prompt_crosses_each_server_once(swarms, sdk_models, tiny_dirs):
    """The servers' caches hold the session about 1.5 times per block: the chain still
    takes each server's blocks in one hop."""
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], attn_cache_tokens=300)
    model = await sdk_models.open(model_dir, swarm.token)
    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want_first = local.generate(ids, **_greedy(1))
        want = local.generate(ids, **_greedy(6))
    before = await _tokens_total(swarm)
    got_first = await asyncio.to_thread(lambda: model.generate(ids, **_greedy(1)))
    prefill = await _tokens_total(swarm)
    assert [p - b for p, b in zip(prefill, before, strict=True)] == [200, 200]
    assert torch.equal(got_first, want_first)
    got = await asyncio.to_thread(lambda: model.generate(ids, **_greedy(6)))
    after = await _tokens_total(swarm)
    assert [a - p for a, p in zip(after, prefill, strict=True)] == [205, 205]  # 200 + 5 steps
    assert torch.equal(got, want)


def _decode_loop(model, ids, steps):
    """transformers' manual cache loop: logits of the prompt and of each greedy token."""
    logits = []
    with torch.no_grad():
        out = model(ids, use_cache=True)
        logits.append(out.logits)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits)
    return logits, out.past_key_values


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # gemma2: sliding-window layers
async def test_a_session_that_outgrows_its_length_keeps_its_caches(
    swarms, sdk_models, tiny_dirs, family
):
    model_dir = tiny_dirs(family)
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    # a forward's cache opens with room for 2 tokens past the prompt, then doubles
    model = await sdk_models.open(model_dir, swarm.token,
                                  client_config=ClientConfig(cache_headroom_tokens=2))  # fmt: skip
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(4))
    before = await _tokens_total(swarm)

    def run():
        got, cache = _decode_loop(model, ids, 60)
        session = cache.session
        return got, session.max_length, [s.socket.session_id for s in session.spans]

    got, grown_to, session_ids = await asyncio.to_thread(run)
    want, _ = _decode_loop(local, ids, 60)
    assert all((g - w).abs().max() < TOL for g, w in zip(got, want, strict=True))
    tokens = torch.cat([ids, *(w[:, -1:].argmax(-1) for w in want[:-1])], dim=1)
    assert torch.equal(tokens, torch.cat([ids, *(g[:, -1:].argmax(-1) for g in got[:-1])], 1))
    assert grown_to >= 100 > 40 + 2  # it outgrew its first length, more than once
    assert len(session_ids) == 2  # the same two sessions all along
    after = await _tokens_total(swarm)
    assert [a - b for a, b in zip(after, before, strict=True)] == [100, 100]  # nothing replayed


async def test_a_span_refusing_to_grow_is_reopened_elsewhere_alone(swarms, sdk_models, tiny_dirs):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2)], attn_cache_tokens=24)
    await swarm.add_server(2, 4, attn_cache_tokens=512)
    model = await sdk_models.open(model_dir, swarm.token)
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        embeds = local.model.embed_tokens(ids)
        want = local(ids).logits
    session = await asyncio.to_thread(model.open_session, max_length=12)
    try:
        first = await asyncio.to_thread(session.step, embeds[:, :6])
        roomy = await swarm.add_server(0, 2, attn_cache_tokens=512)  # room to grow [0, 2) to 64
        refused = swarm.servers[0]
        # [0, 2) on the first server has no room for 64 tokens: it alone moves and replays
        await asyncio.to_thread(session.extend, 64)
        assert session.max_length == 64
        hops = [s.hop.peer_id for s in session.spans]
        assert hops[0] == roomy.node.peer_id and hops[1] == swarm.servers[1].node.peer_id
        assert refused.node.peer_id not in hops
        rest = await asyncio.to_thread(session.step, embeds[:, 6:])
        out = torch.cat([first, rest], dim=1)
    finally:
        await asyncio.to_thread(session.close)
    with torch.no_grad():
        got = local.lm_head(local.model.norm(out))
    assert (got - want).abs().max() < TOL
    # the second server computed each token once; the new one the replayed 6 and the rest
    assert await _tokens_total(swarm) == [6, 10, 10]
