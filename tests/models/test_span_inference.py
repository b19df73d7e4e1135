"""Two spans with their own sessions agree with the full transformers model, every family."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from drift.models.span import ModelSpan
from tests.models import span_checks
from tests.models.span_checks import FORWARD_TOL, step_sessions
from tests.models.tiny_spans import Tiny


def test_prompt_then_single_tokens_match_full_model(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (1, 7), generator=gen)  # longer than every sliding window (4)
    cache = DynamicCache(config=tiny.reference.config)
    sessions = [span.new_session(batch_size=1, max_length=16) for span in tiny.spans]
    with torch.no_grad():
        for _ in range(6):  # the prompt, then 5 single tokens fed back greedily
            ref = tiny.reference(input_ids=ids, cache=cache, use_cache=True).logits
            got = step_sessions(tiny, sessions, ids)
            torch.testing.assert_close(got, ref, atol=FORWARD_TOL, rtol=0)
            ids = got[:, -1:].argmax(-1)
            assert torch.equal(ids, ref[:, -1:].argmax(-1))
    assert [s.position for s in sessions] == [12, 12]


def test_several_tokens_per_step(tiny: Tiny) -> None:
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = tiny.reference(input_ids=ids).logits
        sessions = [span.new_session(batch_size=2, max_length=9) for span in tiny.spans]
        got = torch.cat(
            [step_sessions(tiny, sessions, ids[:, a:b]) for a, b in ((0, 3), (3, 4), (4, 9))], dim=1
        )
    torch.testing.assert_close(got, ref, atol=FORWARD_TOL, rtol=0)


def test_stateless_forward_matches_full_model(tiny: Tiny) -> None:
    span_checks.stateless_forward_matches_full_model(tiny)


def test_sub_spans_compose(tiny: Tiny) -> None:
    """A loaded span serves any sub-span; running its parts in turn equals running it whole."""
    span = tiny.spans[1]
    if span.end_block - span.start_block < 2:
        span = tiny.spans[0]
    mid = span.start_block + 1
    hidden = torch.randn(
        1, 5, tiny.reference.config.hidden_size, generator=torch.Generator().manual_seed(4)
    )
    whole = span(hidden)
    parts = span(span(hidden, end_block=mid), start_block=mid)
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)
    first = span.new_session(batch_size=1, max_length=8, end_block=mid)
    second = span.new_session(batch_size=1, max_length=8, start_block=mid)
    torch.testing.assert_close(second.step(first.step(hidden)), whole, atol=1e-6, rtol=0)


def test_span_parameters_are_its_blocks_only(tiny: Tiny) -> None:
    layers = tiny.reference.base_model.get_submodule(
        "h" if hasattr(tiny.reference.base_model, "h") else "layers"
    )
    for span in tiny.spans:
        expected = sum(
            p.numel()
            for i in range(span.start_block, span.end_block)
            for p in layers[i].parameters()
        )
        assert span.num_parameters() == expected
        assert sum(p.numel() for p in span.parameters()) == expected
    total = sum(p.numel() for p in tiny.reference.parameters())
    assert tiny.spans[0].num_parameters() + tiny.spans[1].num_parameters() < total


def test_load_reports_progress_per_block(tiny: Tiny) -> None:
    calls: list[tuple[int, int]] = []
    ModelSpan.load(
        tiny.ckpt, 0, tiny.split, progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(i, tiny.split) for i in range(1, tiny.split + 1)]
