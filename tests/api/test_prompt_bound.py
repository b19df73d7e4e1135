"""Issue 16, finding 10: `drift api` takes a bounded number of prompts per request."""

from __future__ import annotations

import pytest

from drift.api.protocol import MAX_PROMPTS, parse_completion
from drift.wire.errors import BadRequest


def test_prompts_per_request_are_bounded() -> None:
    ok = parse_completion({"model": "m", "prompt": ["a"] * MAX_PROMPTS})
    assert len(ok.prompts) == MAX_PROMPTS
    for prompt in (["a"] * (MAX_PROMPTS + 1), [[1, 2]] * 10_000):
        with pytest.raises(BadRequest, match=f"at most {MAX_PROMPTS}") as info:
            parse_completion({"model": "m", "prompt": prompt})
        assert info.value.details["param"] == "prompt"
