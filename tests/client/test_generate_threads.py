"""The torch threads generate() runs on (drift.client.head_threads): timed at load where the
client config does not fix them, applied inside generate() only, the count restored after,
and tokens equal local transformers whichever count it is."""

from __future__ import annotations

import asyncio

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from drift.client import ClientConfig
from tests.server.reference import load_reference


class _Threads(LogitsProcessor):
    """Records torch's thread count at each sampling step, changes nothing."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return scores


async def test_generate_runs_on_the_chosen_threads(tiny_dirs, swarms, sdk_models,
                                                   two_threads) -> None:  # fmt: skip
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    measured = await sdk_models.open(model_dir, swarm.token)
    assert set(measured.generate_threads_s) == {2, 1}, measured.generate_threads_s
    assert measured.generate_threads in (None, 1)  # None: torch's own count earned its place
    one = await sdk_models.open(model_dir, swarm.token,
                                client_config=ClientConfig(generate_threads=1))  # fmt: skip
    own = await sdk_models.open(model_dir, swarm.token,
                                client_config=ClientConfig(generate_threads=0))  # fmt: skip
    assert (one.generate_threads, one.generate_threads_s) == (1, {})
    assert (own.generate_threads, own.generate_threads_s) == (None, {})
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(3))
    greedy = dict(max_new_tokens=5, do_sample=False)

    def run(model):
        probe = _Threads()
        out = model.generate(ids, logits_processor=LogitsProcessorList([probe]), **greedy)
        return out, probe.seen

    want = local.generate(ids, **greedy)
    for model, threads in ((one, 1), (own, 2)):
        out, seen = await asyncio.to_thread(run, model)
        assert torch.equal(out, want)
        assert seen == [threads] * 5, seen
        assert torch.get_num_threads() == 2  # restored
