"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation gets its own remote inference session (opened here, closed when the
generation ends or is cancelled), so concurrent requests never share server-side caches
and a cancelled request frees its caches at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from drift.api.engine import CausalLMEngine


def session_cache_factory(model: Any) -> Any:
    """max_length -> context manager of a RemoteCache over a fresh session of `model`."""
    from drift.client.cache import RemoteCache

    @contextlib.contextmanager
    def open_cache(max_length: int) -> Iterator[Any]:
        session = model.model.layers.inference_session(
            max_length=max_length, batch_size=1, dtype=model.dtype
        )
        try:
            yield RemoteCache(session, owned=False)
        finally:
            session.close()

    return open_cache


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str) -> CausalLMEngine:
    """An engine over a `DistributedModelForCausalLM` (from drift.client)."""
    return CausalLMEngine(
        model, tokenizer, model_id=model_id, cache_factory=session_cache_factory(model)
    )
