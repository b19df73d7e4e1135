"""Decode hot-path shortcuts keep results equal to local transformers (logits_to_keep)."""

from __future__ import annotations

import asyncio

import torch

from drift.wire.errors import LengthExceeded
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


async def test_rollback_is_the_sessions_and_recomputes_exactly(tiny_dirs, swarm_model):
    """The session owns its position: rolling back (RemoteCache.crop, or `position =` as in
    Petals) re-runs from there with the servers' caches overwritten; never forward."""
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    hidden = torch.randn(1, 6, local.config.hidden_size, generator=torch.Generator().manual_seed(5))
    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])

    def check():
        with torch.no_grad(), model.open_session(max_length=8) as session:
            first = session.step(hidden)
            session.rollback(2)
            assert session.position == 2
            again = session.step(hidden[:, 2:] * 0.5)
            assert session.position == 6
            try:
                session.position = 7
            except LengthExceeded:
                pass
            else:
                raise AssertionError("a position past the session's was taken")
        with torch.no_grad(), model.open_session(max_length=8) as fresh:
            want = fresh.step(torch.cat([hidden[:, :2], hidden[:, 2:] * 0.5], dim=1))
        assert (first[:, :2] - want[:, :2]).abs().max() < 1e-5
        assert (again - want[:, 2:]).abs().max() < 1e-5

    await asyncio.to_thread(check)
