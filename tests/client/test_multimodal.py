"""Multimodal checkpoints as transformers saves them (Gemma 3 and Mistral 3 under
`language_model.model.`, Gemma 4 under `model.language_model.`), through two real servers on
loopback, against the local `*ForConditionalGeneration`'s text logits and greedy tokens.

Gemma 4 (vision, no audio) is split inside its KV-sharing group: blocks 4 and 5 read the
keys/values of donors 3 and 2, so cut 4 and cut 5 each carry shared K/V across servers. One
client joins with nothing but the token (its embeddings, per-layer inputs, norm and head come
from the swarm's /parts, stored under the text tower's names).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.models.gemma4_helpers import NUM_BLOCKS
from tests.multimodal_models import load_local, save_multimodal

GREEDY = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
CASES = [("gemma4", (0, 4, NUM_BLOCKS)), ("gemma4", (0, 5, NUM_BLOCKS)),
         ("gemma3", (0, 2, 6)), ("mistral3", (0, 2, 4))]  # fmt: skip


def _check(model, local) -> None:
    ids = torch.randint(3, 249, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(ids).logits - local(input_ids=ids).logits).abs().max() < 1e-4
    one = ids[:1]
    assert torch.equal(model.generate(one, **GREEDY), local.generate(one, **GREEDY))


@pytest.mark.parametrize(("family", "bounds"), CASES)
async def test_multimodal_checkpoint_through_two_servers(tmp_path, swarm_model, family, bounds):
    model_dir = save_multimodal(family, tmp_path / family)
    local = load_local(family, model_dir)
    spans = list(zip(bounds, bounds[1:], strict=False))
    _, model = await swarm_model(model_dir, spans)
    await asyncio.to_thread(_check, model, local)


async def test_a_token_only_client_of_a_multimodal_swarm(tmp_path, swarms, sdk_models):
    model_dir = save_multimodal("gemma4", tmp_path / "acme-gemma4")
    swarm = await swarms.start(model_dir, [(0, 4), (4, NUM_BLOCKS)], parts_cache=tmp_path / "srv")
    model = await sdk_models.open(None, swarm.token, cache_dir=tmp_path / "client")
    assert model.client.origin.where.startswith("the swarm (client parts from ")
    await asyncio.to_thread(_check, model, load_local("gemma4", model_dir))
