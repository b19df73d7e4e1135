"""Steps over long pasts run session by session, short ones as one forward (drift.models.batch
`worth_batching`): the batch copies every past into a temporary cache, which pays only
while the pasts are small beside the weights. Either way each session's logits are its own
alone (1e-5), counted by the forwards the span runs and the rows in each."""

from __future__ import annotations

import pytest
import torch

from drift.models.batch import BatchStep, run_steps, worth_batching
from tests.models.span_checks import FORWARD_TOL, open_sessions, step_sessions
from tests.models.tiny_spans import Tiny


def _ids(seed: int, tokens: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tiny", ["llama", "gemma2"], indirect=True)
@pytest.mark.parametrize(("pasts", "batched"), [((7, 3), True), ((200, 150), False)])
def test_long_pasts_step_one_by_one(tiny: Tiny, monkeypatch, pasts, batched) -> None:
    alone = [open_sessions(tiny, 1, max_length=256) for _ in pasts]
    together = [open_sessions(tiny, 1, max_length=256) for _ in pasts]
    for u, past in enumerate(pasts):
        step_sessions(tiny, alone[u], _ids(u, past))
        step_sessions(tiny, together[u], _ids(u, past))
    rows: list[int] = []  # the rows of each forward the first span runs
    span = tiny.spans[0]
    run_layers = span.run_layers

    def counted(layer_ids, hidden, *args, **kwargs):
        rows.append(int(hidden.shape[0]))
        return run_layers(layer_ids, hidden, *args, **kwargs)

    monkeypatch.setattr(span, "run_layers", counted)
    ids = [_ids(100 + u, 1) for u in range(len(pasts))]
    want = [step_sessions(tiny, alone[u], x) for u, x in enumerate(ids)]
    rows.clear()
    steps = [BatchStep(s[0], p, tiny.head.embed(x)) for s, p, x in zip(together, pasts, ids,
                                                                        strict=True)]  # fmt: skip
    assert worth_batching(steps) is batched
    hidden = [out for out, _ in run_steps(steps)]
    assert rows == ([2] if batched else [1, 1])
    for u, h in enumerate(hidden):
        out = together[u][1].step(h)
        torch.testing.assert_close(tiny.head.logits(out), want[u], atol=FORWARD_TOL, rtol=0)
    assert [s[0].position for s in together] == [p + 1 for p in pasts]
