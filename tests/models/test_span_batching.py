"""Steps of several sessions run as one forward (drift.models.batch) equal each session alone.

Every tiny family: sessions with different pasts (longer and shorter than the sliding
windows), one with two rows, one joining with no past at all, and a rollback, batched on
each span; logits within 1e-5 of the same steps run session by session.
"""

from __future__ import annotations

import torch

from drift.models.batch import BatchStep, batch_key, run_steps
from tests.models.span_checks import FORWARD_TOL, open_sessions, step_sessions
from tests.models.tiny_spans import Tiny

PROMPTS = (7, 3, 0)  # past tokens of each user before the batched steps (0: joins fresh)
ROWS = (1, 2, 1)  # rows of each user's session


def _ids(seed: int, rows: int, tokens: int) -> torch.Tensor:
    return torch.randint(0, 256, (rows, tokens), generator=torch.Generator().manual_seed(seed))


def _batched_step(tiny: Tiny, users, ids: list[torch.Tensor], positions: list[int]):
    """One step of every user through both spans, each span's steps run as one forward."""
    hidden = [tiny.head.embed(x) for x in ids]
    for j in range(len(tiny.spans)):
        steps = [
            BatchStep(sessions[j], pos, h)
            for sessions, pos, h in zip(users, positions, hidden, strict=True)
        ]
        assert len({batch_key(s) for s in steps}) == 1
        hidden = [out for out, _ in run_steps(steps)]
    return [tiny.head.logits(h) for h in hidden]


def test_batched_steps_equal_each_session_alone(tiny: Tiny) -> None:
    alone = [open_sessions(tiny, rows, max_length=32) for rows in ROWS]
    batched = [open_sessions(tiny, rows, max_length=32) for rows in ROWS]
    for u, (past, rows) in enumerate(zip(PROMPTS, ROWS, strict=True)):
        if past:
            prompt = _ids(u, rows, past)
            step_sessions(tiny, alone[u], prompt)
            step_sessions(tiny, batched[u], prompt)
    positions = list(PROMPTS)
    for t in range(4):
        ids = [_ids(100 * t + u, rows, 1) for u, rows in enumerate(ROWS)]
        if t == 3:  # user 0 rolls back two tokens and re-steps from there
            positions[0] -= 2
        want = [step_sessions(tiny, alone[u], x, position=positions[u])
                for u, x in enumerate(ids)]  # fmt: skip
        got = _batched_step(tiny, batched, ids, positions)
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g, w, atol=FORWARD_TOL, rtol=0)
        positions = [p + 1 for p in positions]
    for a, b in zip(alone, batched, strict=True):
        assert [s.position for s in a] == [s.position for s in b]


def test_batched_prefill_chunks_of_equal_length(tiny: Tiny) -> None:
    """Two sessions' 3-token steps at different positions, then a decode, batched."""
    alone = [open_sessions(tiny, 1, max_length=32) for _ in range(2)]
    batched = [open_sessions(tiny, 1, max_length=32) for _ in range(2)]
    step_sessions(tiny, alone[0], _ids(9, 1, 5))
    step_sessions(tiny, batched[0], _ids(9, 1, 5))
    ids = [_ids(10, 1, 3), _ids(11, 1, 3)]
    want = [step_sessions(tiny, alone[u], x) for u, x in enumerate(ids)]
    got = _batched_step(tiny, batched, ids, [5, 0])
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, atol=FORWARD_TOL, rtol=0)
