"""Forked sessions (InferenceSession.fork) over real loopback servers: a one-row session's
prompt prefix, computed once, starts every row of a new session; each row then answers as
local transformers does on its whole prompt, through a failover too (the fork's history is
the source's, rows repeated), and the source session is left as it was."""

from __future__ import annotations

import asyncio

import pytest
import torch

from drift.client import ClientConfig
from drift.wire.errors import BadRequest, LengthExceeded
from tests.server.reference import load_reference

TOL = 1e-4
PREFIX = 12


def _ids(seed: int, n: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def _left_padded(rests: list[torch.Tensor], held: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' rests [B, W] left-padded, and the mask over the held prefix and them."""
    width = max(r.shape[1] for r in rests)
    ids = torch.zeros(len(rests), width, dtype=torch.long)
    mask = torch.zeros(len(rests), held + width, dtype=torch.long)
    mask[:, :held] = 1
    for i, r in enumerate(rests):
        ids[i, width - r.shape[1] :] = r
        mask[i, held + width - r.shape[1] :] = 1
    return ids, mask


async def test_a_fork_answers_as_each_whole_prompt_through_a_failover(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    config = ClientConfig(swarm_refresh_s=0.2)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)], client_config=config)
    prefix = _ids(1, PREFIX)
    rests = [_ids(10 + i, n) for i, n in enumerate((3, 1, 4))]

    def first_steps():
        source = model.open_session(max_length=64)
        model(prefix, cache=model.cache_for(source), use_cache=True)
        model(_ids(2, 2), cache=model.cache_for(source), use_cache=True)  # holds more
        forked = source.fork(len(rests), 64, tokens=PREFIX)
        assert (forked.position, source.position) == (PREFIX, PREFIX + 2)
        ids, mask = _left_padded(rests, PREFIX)
        logits = model(ids, attention_mask=mask, cache=model.cache_for(forked),
                       use_cache=True).logits[:, -1]  # fmt: skip
        return source, forked, mask, logits

    source, forked, mask, logits = await asyncio.to_thread(first_steps)
    rows = [torch.cat([prefix, r], 1) for r in rests]
    upper = next(s for s in swarm.servers if s.node.peer_id == forked.spans[1].hop.peer_id)
    for step in range(4):
        for i, row in enumerate(rows):
            with torch.no_grad():
                want = local(row).logits[:, -1]
            torch.testing.assert_close(logits[i : i + 1], want, atol=TOL, rtol=0)
        nxt = logits.argmax(-1, keepdim=True)  # [B, 1]
        rows = [torch.cat([row, nxt[i : i + 1]], 1) for i, row in enumerate(rows)]
        if step == 1:  # the upper span's server leaves: its history is replayed elsewhere
            await swarm.add_server(2, 4)
            await swarm.stop(upper)
            await asyncio.sleep(0.3)
        mask = torch.cat([mask, torch.ones(len(rests), 1, dtype=torch.long)], 1)
        logits = await asyncio.to_thread(
            lambda n=nxt, m=mask: model(n, attention_mask=m, cache=model.cache_for(forked),
                                        use_cache=True).logits[:, -1])  # fmt: skip
    assert forked.failovers >= 1
    assert source.position == PREFIX + 2
    await asyncio.to_thread(forked.close)  # off this loop: the in-process servers run on it
    await asyncio.to_thread(source.close)


async def test_forks_that_cannot_be_are_refused(tiny_dirs, swarm_model):
    swarm, model = await swarm_model(tiny_dirs("llama"), [(0, 2), (2, 4)])

    def refusals():
        two = model.open_session(max_length=32, batch_size=2)
        model(torch.cat([_ids(1, 4), _ids(2, 4)]), cache=model.cache_for(two), use_cache=True)
        with pytest.raises(BadRequest, match="one-row"):
            two.fork(3, 32)
        one = model.open_session(max_length=32)
        model(_ids(3, 4), cache=model.cache_for(one), use_cache=True)
        with pytest.raises(LengthExceeded, match="holds 4"):
            one.fork(3, 32, tokens=5)
        with pytest.raises(LengthExceeded, match="max_length 3"):
            one.fork(3, 3)
        one.close()
        with pytest.raises(BadRequest, match="one-row"):
            one.fork(3, 32)
        two.close()

    await asyncio.to_thread(refusals)


async def test_generate_continues_a_forked_session_as_local_transformers(tiny_dirs, swarm_model):
    """model.fork_session: a system prompt computed once, then generate() on every row's
    whole prompt sends only each rest (left-padded after the prefix) and decodes as local
    transformers does on each prompt alone."""
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    prefix = _ids(1, PREFIX)
    rests = [_ids(10 + i, n) for i, n in enumerate((3, 1, 4))]

    def run():
        with model.open_session(max_length=64) as base:
            model(prefix, cache=model.cache_for(base), use_cache=True)  # computed once
            with model.fork_session(base, len(rests)) as rows:
                assert rows.position == PREFIX
                rest_ids, mask = _left_padded(rests, PREFIX)
                ids = torch.cat([prefix.expand(len(rests), -1), rest_ids], 1)
                return model.generate(ids, attention_mask=mask, session=rows,
                                      max_new_tokens=5, do_sample=False)  # fmt: skip

    out = await asyncio.to_thread(run)
    width = max(r.shape[1] for r in rests)
    for i, rest in enumerate(rests):
        whole = torch.cat([prefix, rest], 1)
        want = local.generate(whole, max_new_tokens=5, do_sample=False)[:, whole.shape[1] :]
        assert torch.equal(out[i : i + 1, PREFIX + width :], want)
