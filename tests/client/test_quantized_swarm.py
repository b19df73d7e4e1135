"""SmolLM2 through a swarm that mixes an nf4 server and a float32 one still answers right."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoTokenizer

from drift.cli.generate import encode_prompt
from drift.client import AutoDistributedModelForCausalLM
from tests.client.conftest import Swarm, stop_swarm

pytestmark = pytest.mark.slow
pytest.importorskip("bitsandbytes")

QUESTION = "What is the capital of France?"


async def test_mixed_swarm_answers_paris(smollm2_dir):
    """One server holds blocks [0, 15) in nf4, the other [15, 30) in float32.

    (nf4 on [15, 30) instead answers "L'Étoile (The City of Love) is the capital of France",
    and all 30 blocks in nf4 "The capital of France is Paris, also known as the City of
    Light": SmolLM2's weights are already 4-bit (Q4_1) and it is small; README has numbers.)
    """
    nf4_span = (0, 15)
    from drift.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint(str(smollm2_dir))
    swarm = Swarm(smollm2_dir, ckpt.fingerprint, 30)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = encode_prompt(tokenizer, QUESTION)
    try:
        for span in ((0, 15), (15, 30)):
            await swarm.add_server(*span, quant_type="nf4" if span == nf4_span else "none")
        quants = {r.server.backend.quant for r in swarm.servers}
        assert quants == {"nf4", "none"}
        model = await asyncio.to_thread(
            AutoDistributedModelForCausalLM.from_pretrained, smollm2_dir,
            initial_peers=swarm.token,
        )  # fmt: skip
        try:
            out = await asyncio.to_thread(
                model.generate, ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                do_sample=False, pad_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
        finally:
            await asyncio.to_thread(model.close)
    finally:
        await stop_swarm(swarm)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    print(f"\nnf4 on blocks {nf4_span}: {answer!r}")
    assert "Paris" in answer
