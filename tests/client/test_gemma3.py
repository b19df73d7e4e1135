"""The real Gemma 3 270M on two servers (0:6 / 6:18) through the SDK vs local transformers.

The split cuts between the first full-attention layer (5) and a sliding one (6). Servers and
client open the model by its alias in one shared cache, as `drift server gemma3-270m` and
`from_pretrained("gemma3-270m")` would, with the tokenizer from drift.load_tokenizer.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

import drift
from drift.models.checkpoint import open_checkpoint

pytestmark = pytest.mark.slow

PROMPT = "The three primary colors are"  # the GGUF has no chat template: plain text
SECOND = "Water boils at a temperature of one hundred"
ALIAS = "gemma3-270m"
SPANS = [(0, 6), (6, 18)]


async def test_gemma3_matches_transformers(gemma3_cache, swarms, sdk_models):
    ckpt = open_checkpoint(ALIAS, cache_dir=gemma3_cache)
    local = AutoModelForCausalLM.from_pretrained(
        ckpt.path, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    tokenizer = drift.load_tokenizer(ALIAS, cache_dir=gemma3_cache)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    assert ids[0, 0] == tokenizer.bos_token_id == 2
    tokenizer.padding_side = "left"
    batch = tokenizer([SECOND, PROMPT], return_tensors="pt", padding=True)
    assert batch.attention_mask[1, 0] == 0  # the shorter prompt is left-padded
    swarm = await swarms.start(ALIAS, SPANS, cache_dir=gemma3_cache)
    assert [s.server.backend.fingerprint for s in swarm.servers] == [ckpt.fingerprint] * 2

    def check(model):
        assert model.config.model_type == "gemma3_text"
        with torch.no_grad():
            got, ref = model(ids).logits, local(ids).logits
        diff = (got - ref).abs().max().item()
        print(f"\ngemma3 over two servers: logits diff {diff:.2e}")
        assert diff < 1e-4
        pad = tokenizer.pad_token_id
        greedy = dict(max_new_tokens=16, do_sample=False, pad_token_id=pad)
        out, ref_out = model.generate(ids, **greedy), local.generate(ids, **greedy)
        print(repr(tokenizer.decode(out[0, ids.shape[1] :])))
        assert out.shape[1] == ids.shape[1] + 16  # no early stop: all 16 tokens compared
        assert torch.equal(out, ref_out)
        padded = dict(batch, max_new_tokens=8, do_sample=False, pad_token_id=pad)
        assert torch.equal(model.generate(**padded), local.generate(**padded))

    model = await sdk_models.open(ALIAS, swarm.token, cache_dir=gemma3_cache)
    await asyncio.to_thread(check, model)
