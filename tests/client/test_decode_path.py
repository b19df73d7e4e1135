"""Decode hot-path shortcuts keep results equal to local transformers (logits_to_keep)."""

from __future__ import annotations

import asyncio

import torch

from tests.server.reference import load_reference


async def test_logits_to_keep_matches_local(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))

    def check(model):
        assert model._supports_logits_to_keep()  # generate() asks for the last position only
        with torch.no_grad():
            ref = local(ids).logits
            last = model(ids, logits_to_keep=1).logits
            two = model(ids, logits_to_keep=torch.tensor([0, 4])).logits
            full = model(ids, logits_to_keep=0).logits
        assert last.shape == (2, 1, ref.shape[-1])
        assert (last - ref[:, -1:]).abs().max() < 1e-4
        assert (two - ref[:, [0, 4]]).abs().max() < 1e-4
        assert (full - ref).abs().max() < 1e-4
        greedy = model.generate(ids, max_new_tokens=5, do_sample=False)
        assert torch.equal(greedy, local.generate(ids, max_new_tokens=5, do_sample=False))

    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    await asyncio.to_thread(check, model)
