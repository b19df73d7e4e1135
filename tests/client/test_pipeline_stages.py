"""A long prompt's chunks overlap along servers on different cores, and go one after the other
through servers that announce the same cores (drift.server.compute_name): real servers, the
client's own chain, tokens equal to local transformers' either way."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from drift.client import ClientConfig
from drift.client.chain import Chain, pipeline_stages
from drift.client.routing import Hop
from drift.server.compute_name import compute_name

pytestmark = pytest.mark.timeout(300)


def test_stages_join_neighbours_on_the_same_cores() -> None:
    def hops(*names):
        return [Hop(f"p{i}", f"http://h{i}", i, i + 1, n) for i, n in enumerate(names)]

    assert pipeline_stages(hops(None, None, None)) == [range(0, 1), range(1, 2), range(2, 3)]
    assert pipeline_stages(hops("a", "a", "b")) == [range(0, 2), range(2, 3)]
    assert pipeline_stages(hops("a", "b", "a")) == [range(0, 1), range(1, 2), range(2, 3)]
    assert pipeline_stages(hops("a", "a", "a")) == [range(0, 3)]
    assert pipeline_stages(hops(None, "a", "a")) == [range(0, 1), range(1, 3)]
    assert Hop("p", "u", 0, 1, "a") == Hop("p", "u", 0, 1, None)  # routes compare as before


async def _announce(swarm, names: list[str]) -> None:
    for running, name in zip(swarm.servers, names, strict=True):
        assert running.server.compute == compute_name(running.server.backend.span.device)
        running.server.compute = name
        running.node.announce(**running.server.record_fields())
    deadline = time.monotonic() + 10
    want = {s.node.peer_id: n for s, n in zip(swarm.servers, names, strict=True)}
    while {r.peer_id: r.compute for r in swarm.seed.node.live_records()
           if r.peer_id in want} != want:  # fmt: skip
        assert time.monotonic() < deadline, "the seed did not learn the names"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(("names", "overlap"), [(["cores-a", "cores-b"], True),
                                                (["cores-a", "cores-a"], False)])  # fmt: skip
async def test_chunks_overlap_only_across_other_cores(names, overlap, tiny_dirs, swarms,
                                                      sdk_models, monkeypatch) -> None:  # fmt: skip
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    await _announce(swarm, names)
    model = await sdk_models.open(model_dir, swarm.token,
                                  client_config=ClientConfig(prefill_chunk_tokens=3))  # fmt: skip
    flight, peak = [0], [0]
    advance = Chain.advance

    async def counted(self, *args, **kwargs):
        flight[0] += 1
        peak[0] = max(peak[0], flight[0])
        try:
            return await advance(self, *args, **kwargs)
        finally:
            flight[0] -= 1

    monkeypatch.setattr(Chain, "advance", counted)
    ids = torch.randint(3, 249, (1, 12), generator=torch.Generator().manual_seed(3))
    greedy = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = local.generate(ids, **greedy)
    got = await asyncio.to_thread(model.generate, ids, **greedy)
    assert torch.equal(got, want)
    assert peak[0] == (2 if overlap else 1)  # 4 chunks of 3 tokens, 2 spans
