"""SmolLM2 through a swarm that mixes an nf4 server and a float32 one still answers right."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoTokenizer

from drift.cli.generate import encode_prompt

pytestmark = pytest.mark.slow
pytest.importorskip("bitsandbytes")

QUESTION = "What is the capital of France?"


async def test_mixed_swarm_answers_paris(smollm2_dir, swarms, sdk_models):
    """One server holds blocks [0, 15) in nf4, the other [15, 30) in float32.

    (nf4 on [15, 30) instead answers "L'Étoile (The City of Love) is the capital of France",
    and all 30 blocks in nf4 "The capital of France is Paris, also known as the City of
    Light": SmolLM2's weights are already 4-bit (Q4_1) and it is small; README has numbers.)
    """
    nf4_span = (0, 15)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = encode_prompt(tokenizer, QUESTION)
    swarm = await swarms.start(smollm2_dir, [nf4_span], quant_type="nf4")
    await swarm.add_server(15, 30, quant_type="none")
    quants = {r.server.backend.quant for r in swarm.servers}
    assert quants == {"nf4", "none"}
    model = await sdk_models.open(smollm2_dir, swarm.token)
    out = await asyncio.to_thread(
        model.generate, ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
        do_sample=False, pad_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    print(f"\nnf4 on blocks {nf4_span}: {answer!r}")
    assert "Paris" in answer
