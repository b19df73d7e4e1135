"""Backward through two spans equals autograd through the full transformers model.

The gradient checks live in tests/models/span_checks.py: they also run on real weights.
"""

from __future__ import annotations

import torch

from tests.models import span_checks
from tests.models.tiny_spans import Tiny


def test_input_grads_match_full_model(tiny: Tiny) -> None:
    span_checks.input_grads_match_full_model(tiny)


def test_deep_prompt_grads_match_hooked_full_model(tiny: Tiny) -> None:
    span_checks.deep_prompt_grads_match_hooked_full_model(tiny)


def test_deep_prompts_change_the_output_only_through_their_positions(tiny: Tiny) -> None:
    """Prompts are added to positions [0, P) before each block, also inside a session."""
    span = tiny.spans[1]
    n = span.end_block - span.start_block
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(1, 5, tiny.reference.config.hidden_size, generator=gen)
    prompts = torch.randn(n, 1, 2, hidden.shape[-1], generator=gen)
    stateless = span(hidden, prompts=prompts)
    assert not torch.allclose(stateless, span(hidden), atol=1e-3)
    session = span.new_session(batch_size=1, max_length=5)
    stepped = torch.cat(
        [
            session.step(hidden[:, :1], prompts=prompts),
            session.step(hidden[:, 1:], prompts=prompts),
        ],
        dim=1,
    )
    torch.testing.assert_close(stepped, stateless, atol=1e-5, rtol=0)
