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


async def test_nf4_bfloat16_swarm_equals_local_quantized(smollm2_dir, swarms, sdk_models):
    """Servers in nf4 over bfloat16 and a bfloat16 client give what transformers gives with the
    same layers quantized the same way (drift.models.quant.quantize_layer): the same logits and
    greedy tokens. (A float32 client differs by bfloat16's rounding of the head, ~0.2 in the
    logits here: compare in the servers' dtype.)"""
    from transformers import AutoModelForCausalLM

    from drift.models.quant import quantize_layer

    swarm = await swarms.start(smollm2_dir, [(0, 15), (15, 30)], quant_type="nf4",
                               torch_dtype="bfloat16")  # fmt: skip
    model = await sdk_models.open(smollm2_dir, swarm.token, dtype=torch.bfloat16)
    ids = torch.randint(0, 40000, (1, 12), generator=torch.Generator().manual_seed(0))

    def reference() -> tuple[torch.Tensor, torch.Tensor]:
        local = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16).eval()
        layers = local.model.layers
        for i, layer in enumerate(layers):
            layers[i] = quantize_layer(layer, "nf4", torch.bfloat16, torch.device("cpu"))
        with torch.inference_mode():
            tokens = local.generate(ids, max_new_tokens=16, do_sample=False)
            return tokens, local(ids).logits.float()

    # ~10 s of quantizing and decoding: off the event loop, where the servers gossip (their
    # records expire after 5 s without it)
    want, want_logits = await asyncio.to_thread(reference)
    got = await asyncio.to_thread(model.generate, ids, max_new_tokens=16, do_sample=False)

    def logits() -> torch.Tensor:
        with torch.no_grad():
            return model(ids).logits.float()

    got_logits = await asyncio.to_thread(logits)
    assert torch.equal(got, want), (got[0, 12:].tolist(), want[0, 12:].tolist())
    torch.testing.assert_close(got_logits, want_logits, atol=0.05, rtol=0)
