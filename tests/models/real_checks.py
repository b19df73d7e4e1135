"""The tiny-model span checks that also run on real weights (SmolLM2, Gemma 3)."""

from __future__ import annotations

from tests.models import test_span_backward, test_span_inference, test_span_sessions

REAL_MODEL_CHECKS = [
    test_span_inference.test_stateless_forward_matches_full_model,
    test_span_sessions.test_left_padded_batch_matches_each_sequence_alone,
    test_span_sessions.test_beam_reorder_matches_reordered_histories,
    test_span_sessions.test_rollback_matches_a_fresh_run,
    test_span_backward.test_input_grads_match_full_model,
    test_span_backward.test_deep_prompt_grads_match_hooked_full_model,
]
