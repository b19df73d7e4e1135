"""Gemma 4 steps of several sessions run as one forward (drift.models.batch) equal each
session alone: per-layer inputs and received K/V stacked row-wise, pasts taken from the
sessions' cache slots (a consumer's is its donor's), donated K/V split back by rows.

Three users (pasts 11 (> the sliding window, 8), 3, and none; one of two rows) step 4 tokens
through the spans of every Gemma 4 family, each span's steps batched; one user rolls back two
tokens on the last step. Cuts (4,): a consumer span reading two donors before it; (3, 5): a
middle span that both donates (3 -> 4) and passes a donor's K/V through (2 -> 5). Every span
forward holds all four rows (the batch really ran as one), and the logits equal each user's
chain run alone within 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from drift.models.batch import BatchStep, batch_key, run_steps
from tests.models.gemma4_helpers import G4, NUM_BLOCKS, ChainSession, extras_for, load_g4
from tests.tiny_models import GEMMA4_FAMILIES

LOGITS_TOL = 1e-5
PASTS = (11, 3, 0)
ROWS = (1, 2, 1)


@pytest.fixture(scope="module", params=GEMMA4_FAMILIES)
def g4(request, tmp_path_factory) -> G4:
    return load_g4(request.param, tmp_path_factory.mktemp(request.param))


def _ids(seed: int, rows: int, tokens: int) -> torch.Tensor:
    # < 249: clear of the multimodal checkpoint's image/audio placeholder ids
    return torch.randint(3, 249, (rows, tokens), generator=torch.Generator().manual_seed(seed))


def _batched_step(g: G4, users: list[ChainSession], ids: list[torch.Tensor],
                  positions: list[int]) -> list[torch.Tensor]:  # fmt: skip
    """One step of every user, each span's steps run as one forward; each user's logits."""
    embeds = [g.head.embed(x) for x in ids]
    per_layer = [g.head.per_layer_inputs(x, e) for x, e in zip(ids, embeds, strict=True)]
    shared: list[dict[str, torch.Tensor]] = [{} for _ in users]
    hidden = embeds
    for j in range(len(users[0].sessions)):
        steps = []
        for u, user in enumerate(users):
            s = user.sessions[j]
            a, b = s.start_block, s.end_block
            extras = extras_for(g, a, b, per_layer[u], shared[u])
            donate = g.head.sharing.donated(a, b, NUM_BLOCKS)
            steps.append(BatchStep(s, positions[u], hidden[u], None, extras, donate))
        assert len({batch_key(st) for st in steps}) == 1
        outs = run_steps(steps)
        hidden = [out for out, _ in outs]
        for u, (_, donated) in enumerate(outs):
            assert sorted(donated) == sorted(
                n for d in steps[u].donate for n in (f"kv.{d}.k", f"kv.{d}.v")
            )
            shared[u].update(donated)
    return [g.head.logits(h) for h in hidden]


@torch.no_grad()
@pytest.mark.parametrize("cuts", [(4,), (3, 5)])
def test_batched_gemma4_steps_equal_each_session_alone(g4, cuts, monkeypatch):
    spans = g4.spans(cuts)
    rows_seen: list[int] = []
    for span in spans:
        run_layers = span.run_layers

        def counted(layer_ids, hidden, *args, _run=run_layers, **kwargs):
            rows_seen.append(int(hidden.shape[0]))
            return _run(layer_ids, hidden, *args, **kwargs)

        monkeypatch.setattr(span, "run_layers", counted)
    alone = [ChainSession(g4, cuts, batch_size=r, max_length=32) for r in ROWS]
    batched = [ChainSession(g4, cuts, batch_size=r, max_length=32) for r in ROWS]
    for u, (past, rows) in enumerate(zip(PASTS, ROWS, strict=True)):
        if past:
            prompt = _ids(u, rows, past)
            alone[u].step(prompt, position=0)
            batched[u].step(prompt, position=0)
    positions = list(PASTS)
    for t in range(4):
        ids = [_ids(100 * t + u, rows, 1) for u, rows in enumerate(ROWS)]
        if t == 3:  # user 0 rolls back two tokens and re-steps from there
            positions[0] -= 2
        want = [alone[u].step(x, position=positions[u]) for u, x in enumerate(ids)]
        rows_seen.clear()
        got = _batched_step(g4, batched, ids, positions)
        assert rows_seen == [sum(ROWS)] * len(spans), "each span ran the users as one batch"
        for u, (w, g) in enumerate(zip(want, got, strict=True)):
            assert (g - w).abs().max() < LOGITS_TOL, f"step {t}, user {u}"
        positions = [p + 1 for p in positions]
    for a, b in zip(alone, batched, strict=True):
        assert [s.position for s in a.sessions] == [s.position for s in b.sessions]
