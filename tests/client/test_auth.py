"""Private swarms: the client proves the swarm key with HMAC headers (HTTP and WebSocket)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from drift.client import ClientConfig
from drift.node.auth import AUTH_HEADER
from drift.wire.errors import Forbidden, Unauthorized

KEY = "s3cret-swarm-key"


async def test_private_swarm_with_key_matches_local(tiny_dirs, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[4, 8, 15, 16, 23]])
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], swarm_key=KEY)
    # compress_min_bytes=1: zstd bodies are signed and accepted too
    model = await sdk_models.open(
        model_dir, swarm.token, swarm_key=KEY, client_config=ClientConfig(compress_min_bytes=1)
    )
    out = await asyncio.to_thread(model.generate, ids, max_new_tokens=5, do_sample=False)
    with torch.no_grad():
        logits = (await asyncio.to_thread(model, ids)).logits
    assert torch.equal(out, local.generate(ids, max_new_tokens=5, do_sample=False))
    with torch.no_grad():
        assert (logits - local(ids).logits).abs().max() < 1e-4
    # the key may also ride in the join token
    token = swarm.seed.node.join_token().to_drift(with_key=True)
    assert "?key=" in token
    model = await sdk_models.open(model_dir, token)
    again = await asyncio.to_thread(model.generate, ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(again, out)


async def test_private_swarm_without_or_with_wrong_key_is_refused_clearly(
    tiny_dirs, swarms, sdk_models
):
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[1, 2, 3]])
    swarm = await swarms.start(model_dir, [(0, 4)], swarm_key=KEY)
    model = await sdk_models.open(model_dir, swarm.token)
    with pytest.raises(Unauthorized, match="private: pass swarm_key="):
        await asyncio.to_thread(model, ids)
    model = await sdk_models.open(model_dir, swarm.token, swarm_key="wrong")
    with pytest.raises(Forbidden, match="does not match"):
        await asyncio.to_thread(model, ids)


def test_no_bearer_token_is_sent():
    """The key itself never leaves the client: only an HMAC proof."""
    from drift.wire.auth import auth_headers

    headers = auth_headers(KEY, "POST", "/forward", b"body", peer_id="12D3KooWx")
    assert set(headers) == {AUTH_HEADER} and KEY not in headers[AUTH_HEADER]
