"""Sessions: left-padded batches, beam reorders and rollbacks equal plain runs, every family.

The checks live in tests/models/span_checks.py: they also run on real weights.
"""

from __future__ import annotations

from tests.models import span_checks
from tests.models.tiny_spans import Tiny


def test_left_padded_batch_matches_each_sequence_alone(tiny: Tiny) -> None:
    span_checks.left_padded_batch_matches_each_sequence_alone(tiny)


def test_beam_reorder_matches_reordered_histories(tiny: Tiny) -> None:
    span_checks.beam_reorder_matches_reordered_histories(tiny)


def test_rollback_matches_a_fresh_run(tiny: Tiny) -> None:
    span_checks.rollback_matches_a_fresh_run(tiny)
