"""Sessions: left-padded batches, beam reorders and rollbacks equal plain runs, every family."""

from __future__ import annotations

import torch

from tests.models.conftest import Tiny


def _open(tiny: Tiny, batch: int, max_length: int = 16):
    return [span.new_session(batch_size=batch, max_length=max_length) for span in tiny.spans]


def _step(tiny: Tiny, sessions, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    hidden = tiny.head.embed(ids)
    for session in sessions:
        hidden = session.step(hidden, **kwargs)
    return tiny.head.logits(hidden)


def test_left_padded_batch_matches_each_sequence_alone(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(8)
    lengths = [5, 3, 6]
    prompts = [torch.randint(0, 256, (1, n), generator=gen) for n in lengths]
    steps = torch.randint(0, 256, (3, 3), generator=gen)  # 3 more tokens per sequence
    width = max(lengths)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.shape[1] :] = prompt
        mask[row, width - prompt.shape[1] :] = 1
    batch = _open(tiny, 3)
    outs = [_step(tiny, batch, ids, attention_mask=mask)[:, -1]]
    outs += [_step(tiny, batch, steps[:, i : i + 1])[:, -1] for i in range(3)]
    stateless = _run_stateless(
        tiny, torch.cat([ids, steps], 1), torch.cat([mask, torch.ones(3, 3, dtype=torch.long)], 1)
    )
    for row, prompt in enumerate(prompts):
        alone = _open(tiny, 1)
        expected = [_step(tiny, alone, prompt)[:, -1]]
        expected += [_step(tiny, alone, steps[row : row + 1, i : i + 1])[:, -1] for i in range(3)]
        for got, want in zip(outs, expected, strict=True):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got[row : row + 1], want, atol=tiny.batch_tol, rtol=0)
        torch.testing.assert_close(stateless[row, -1:], expected[-1], atol=tiny.batch_tol, rtol=0)


def _run_stateless(tiny: Tiny, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    hidden = tiny.head.embed(ids)
    for span in tiny.spans:
        hidden = span(hidden, attention_mask=mask)
    return tiny.head.logits(hidden)


def _alone(tiny: Tiny, ids: torch.Tensor) -> torch.Tensor:
    """Last-token logits of each row run from scratch, without a cache."""
    hidden = tiny.head.embed(ids)
    for span in tiny.spans:
        hidden = span(hidden)
    return tiny.head.logits(hidden)[:, -1]


def test_beam_reorder_matches_reordered_histories(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(9)
    history = torch.randint(0, 256, (3, 6), generator=gen)
    sessions = _open(tiny, 3)
    _step(tiny, sessions, history)
    hypo_ids = torch.tensor([2, 0, 0])
    new = torch.randint(0, 256, (3, 1), generator=gen)
    got = _step(tiny, sessions, new, hypo_ids=hypo_ids)[:, -1]
    expected = _alone(tiny, torch.cat([history[hypo_ids], new], dim=1))
    torch.testing.assert_close(got, expected, atol=tiny.batch_tol, rtol=0)
    more = torch.randint(0, 256, (3, 1), generator=gen)
    got = _step(tiny, sessions, more, hypo_ids=torch.tensor([1, 2, 0]))[:, -1]
    rows = torch.cat([history[hypo_ids], new], dim=1)[torch.tensor([1, 2, 0])]
    torch.testing.assert_close(
        got, _alone(tiny, torch.cat([rows, more], 1)), atol=tiny.batch_tol, rtol=0
    )


def test_rollback_matches_a_fresh_run(tiny: Tiny) -> None:
    """Roll back past the sliding window (4) and continue with other tokens."""
    gen = torch.Generator().manual_seed(10)
    prompt = torch.randint(0, 256, (1, 6), generator=gen)
    sessions = _open(tiny, 1)
    _step(tiny, sessions, prompt)
    for _ in range(4):
        _step(tiny, sessions, torch.randint(0, 256, (1, 1), generator=gen))
    assert sessions[0].position == 10
    other = torch.randint(0, 256, (1, 2), generator=gen)
    got = _step(tiny, sessions, other, position=5)
    assert [s.position for s in sessions] == [7, 7]
    history = torch.cat([prompt[:, :5], other], dim=1)
    expected = _alone(tiny, history)
    torch.testing.assert_close(got[:, -1], expected, atol=tiny.batch_tol, rtol=0)
    nxt = torch.randint(0, 256, (1, 1), generator=gen)
    got = _step(tiny, sessions, nxt)[:, -1]
    torch.testing.assert_close(
        got, _alone(tiny, torch.cat([history, nxt], 1)), atol=tiny.batch_tol, rtol=0
    )
