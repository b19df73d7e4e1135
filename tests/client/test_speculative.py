"""Speculative decoding through the swarm with push on: prompt lookup
(`prompt_lookup_num_tokens`) and a draft model on the client (`assistant_model`, a perfect
one and a wrong one whose drafts the swarm rejects and rolls back) give plain greedy
decoding's tokens, token for token, checking several tokens per step."""

from __future__ import annotations

import asyncio

import torch

from tests.client.push_helpers import SPANS, wait_all_know_each_other
from tests.server.reference import load_reference
from tests.tiny_models import build_tiny

# a prompt that repeats itself, so prompt lookup finds candidates
IDS = torch.tensor([[5, 17, 42, 8, 99, 23, 5, 17, 42, 8, 99, 23, 5, 17, 42]])
NEW = 16


async def test_prompt_lookup_and_assistant_equal_greedy(tiny_dirs, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    swarm = await swarms.start(model_dir, SPANS)
    await wait_all_know_each_other(swarm)
    model = await sdk_models.open(model_dir, swarm.token)
    local = load_reference(model_dir)
    wrong = build_tiny("llama", seed=1).eval()  # same vocabulary, other weights
    plain = local.generate(IDS, max_new_tokens=NEW, do_sample=False)

    def served() -> int:
        return sum(s.server.metrics.step_latency.count for s in swarm.servers[:1])

    def run(**kwargs) -> tuple[torch.Tensor, int]:
        before = served()
        with torch.no_grad():
            out = model.generate(IDS, max_new_tokens=NEW, do_sample=False, **kwargs)
        return out, served() - before

    greedy, steps = await asyncio.to_thread(run)
    assert torch.equal(greedy, plain)
    for kwargs in ({"prompt_lookup_num_tokens": 4}, {"assistant_model": local},
                   {"assistant_model": wrong}):  # fmt: skip
        got, used = await asyncio.to_thread(run, **kwargs)
        assert torch.equal(got, plain), kwargs
        if kwargs.get("assistant_model") is local:
            assert used < steps  # a perfect draft: several tokens checked per step
