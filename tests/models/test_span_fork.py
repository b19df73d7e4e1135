"""A session forked from another's prompt prefix (SpanSession.fork) equals computing it.

Every tiny family: a one-row session holds a prefix and more; a 3-row session forked at the
prefix then takes each row's own suffix (left-padded after the prefix where the suffixes
differ in length) and decodes; each row's logits equal a fresh one-row session run on the
whole prompt, and transformers' full model on the same ids. The source session is not
touched. Forks that cannot be are refused with BadRequest, leaving the session empty.
"""

from __future__ import annotations

import pytest
import torch

from drift.wire.errors import BadRequest
from tests.models.span_checks import FORWARD_TOL, open_sessions, step_sessions
from tests.models.tiny_spans import Tiny

PREFIX = 9


def _ids(seed: int, tokens: int) -> torch.Tensor:
    return torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(seed))


def _windowed(tiny: Tiny) -> bool:
    config = tiny.reference.config
    kinds = getattr(config, "layer_types", None) or ()
    return any("sliding" in str(k) for k in kinds) or (
        getattr(config, "sliding_window", None) is not None
        and getattr(config, "use_sliding_window", True)
    )


def _fork_all(tiny: Tiny, source, rows: int, tokens: int, max_length: int = 32):
    forked = open_sessions(tiny, rows, max_length=max_length)
    for f, s in zip(forked, source, strict=True):
        f.fork(s, tokens)
    return forked


def test_a_forked_session_equals_the_whole_prompt_computed(tiny: Tiny) -> None:
    prefix = _ids(1, PREFIX)
    source = open_sessions(tiny, 1, max_length=32)
    step_sessions(tiny, source, torch.cat([prefix, _ids(2, 4)], 1))  # holds more than the prefix
    before = [s.position for s in source]
    # a sliding window counts cache slots: padding between prefix and suffix would shift it
    lengths = (3, 3, 3) if _windowed(tiny) else (3, 1, 4)
    suffixes = [_ids(10 + r, n) for r, n in enumerate(lengths)]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for r, s in enumerate(suffixes):
        ids[r, width - s.shape[1] :], mask[r, width - s.shape[1] :] = s, 1
    forked = _fork_all(tiny, source, len(lengths), PREFIX)
    assert [f.position for f in forked] == [PREFIX, PREFIX]
    got = [step_sessions(tiny, forked, ids, attention_mask=mask)[:, -1]]
    nxt = _ids(99, 1).repeat(len(lengths), 1)
    got.append(step_sessions(tiny, forked, nxt)[:, -1])
    for r, s in enumerate(suffixes):
        whole = torch.cat([prefix, s], 1)
        alone = open_sessions(tiny, 1, max_length=32)
        want = [step_sessions(tiny, alone, whole)[:, -1]]
        want.append(step_sessions(tiny, alone, nxt[:1])[:, -1])
        with torch.no_grad():
            ref = tiny.reference(input_ids=torch.cat([whole, nxt[:1]], 1)).logits
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g[r : r + 1], w, atol=tiny.batch_tol, rtol=0)
        torch.testing.assert_close(got[0][r : r + 1], ref[:, -2], atol=FORWARD_TOL, rtol=0)
        torch.testing.assert_close(got[1][r : r + 1], ref[:, -1], atol=FORWARD_TOL, rtol=0)
    assert [s.position for s in source] == before  # the source is untouched


def test_a_fork_that_cannot_be_is_refused_and_leaves_the_session_empty(tiny: Tiny) -> None:
    two = open_sessions(tiny, 2, max_length=32)
    step_sessions(tiny, two, torch.cat([_ids(1, 5), _ids(2, 5)]))
    one = open_sessions(tiny, 1, max_length=32)
    step_sessions(tiny, one, _ids(3, 5))
    span = tiny.spans[0]
    for source, tokens, words in ((two[0], 3, "one-row"), (one[0], 6, "holds 5"),
                                  (one[1], 3, "same blocks")):  # fmt: skip
        fresh = span.new_session(batch_size=2, max_length=32)
        with pytest.raises(BadRequest, match=words):
            fresh.fork(source, tokens)
        assert fresh.position == 0
    short = span.new_session(batch_size=2, max_length=4)
    with pytest.raises(Exception, match="max_length"):
        short.fork(one[0], 5)
