"""The real SmolLM2-135M on two servers (0:15 / 15:30) through the SDK vs local transformers."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow

PROMPT = [1, 504, 3458, 282, 4649, 314]  # a short prompt in SmolLM2's vocab


async def test_smollm2_matches_transformers(smollm2_dir, swarm_model):
    local = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    pad = int(local.generation_config.eos_token_id or 2)
    batch = torch.tensor([PROMPT, [pad, pad, pad, 28, 3821, 314]])  # left-padded second prompt
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])

    def check(model):
        with torch.no_grad():
            got, ref = model(ids).logits, local(ids).logits
        assert (got - ref).abs().max() < 1e-4
        greedy = dict(max_new_tokens=20, do_sample=False, pad_token_id=pad)
        assert torch.equal(model.generate(ids, **greedy), local.generate(ids, **greedy))
        for kw in (
            dict(max_new_tokens=12, do_sample=True, top_k=40, temperature=0.8),
            dict(max_new_tokens=10, do_sample=False, num_beams=3),
        ):
            torch.manual_seed(11)
            ref_out = local.generate(ids, pad_token_id=pad, **kw)
            torch.manual_seed(11)
            out = model.generate(ids, pad_token_id=pad, **kw)
            assert torch.equal(out, ref_out), kw
        padded = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=pad)
        assert torch.equal(model.generate(batch, **padded), local.generate(batch, **padded))

    _, model = await swarm_model(smollm2_dir, [(0, 15), (15, 30)])
    await asyncio.to_thread(check, model)
