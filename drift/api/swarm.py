"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation opens its own remote session through the client's public API
(`model.open_session`, then `generate(..., session=s)`), so concurrent requests never share
server-side caches, a cancelled request frees its caches at once, and the session's spans
tell which servers ran the blocks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from drift.api.engine import CausalLMEngine, OpenedSessions, ServedSpan


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str, **kwargs: Any) -> CausalLMEngine:
    """An engine over a `DistributedModelForCausalLM` (from drift.client)."""

    @contextlib.contextmanager
    def sessions(max_length: int, batch_size: int) -> Iterator[OpenedSessions]:
        session = model.open_session(max_length=max_length, batch_size=batch_size)

        def route() -> tuple[ServedSpan, ...]:
            return tuple(
                ServedSpan(s.hop.peer_id, s.hop.addr, s.hop.start_block, s.hop.end_block)
                for s in session.spans
            )

        try:
            yield OpenedSessions({"session": session}, route)
        finally:
            session.close()

    return CausalLMEngine(model, tokenizer, model_id=model_id, sessions=sessions, **kwargs)
