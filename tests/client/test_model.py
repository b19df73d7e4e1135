"""The distributed model against local transformers on the same tiny weights."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from drift.client import AutoDistributedModelForCausalLM
from tests.client.conftest import start_swarm, stop_swarm


def _local(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


async def _with_model(model_dir, spans, fn):
    swarm = await start_swarm(model_dir, spans)
    try:
        model = await asyncio.to_thread(
            AutoDistributedModelForCausalLM.from_pretrained, model_dir, initial_peers=swarm.token
        )
        try:
            return await asyncio.to_thread(fn, model, swarm)
        finally:
            await asyncio.to_thread(model.close)
    finally:
        await stop_swarm(swarm)


@pytest.mark.parametrize("family", ["llama"])
async def test_logits_match_local(tiny_dirs, family):
    model_dir = tiny_dirs(family)
    local = _local(model_dir)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))

    def check(model, swarm):
        with torch.no_grad():
            out = model(ids)
            ref = local(ids)
        assert (out.logits - ref.logits).abs().max() < 1e-4
        greedy = model.generate(ids, max_new_tokens=6, do_sample=False)
        ref_greedy = local.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(greedy, ref_greedy)

    await _with_model(model_dir, [(0, 2), (2, 4)], check)
