"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation opens its own remote session through the client's public API
(`model.open_session`, then `generate(..., session=s)`), so concurrent requests never share
server-side caches, a cancelled request frees its caches at once, and the session's spans
tell which servers ran the blocks. With a `SessionPool` (drift.api.prefix), a one-row
generation's session is kept when it ends cleanly and a later prompt starting with its
tokens (the next chat turn) continues it: only the new tokens are sent. Such sessions are
opened `headroom_tokens` longer than asked, so the next turn fits without reopening.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from drift.api.engine import CausalLMEngine, OpenedSessions, ServedSpan
from drift.api.prefix import SessionPool
from drift.wire.errors import LengthExceeded


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str, pool: SessionPool | None = None,
                 headroom_tokens: int = 512, **kwargs: Any) -> CausalLMEngine:  # fmt: skip
    """An engine over a `DistributedModelForCausalLM` (from drift.client); with `pool`,
    one-row generations continue held sessions sharing their prompt's prefix."""

    def open_session(max_length: int, batch_size: int, prompt: Sequence[int] | None) -> Any:
        if pool is None or prompt is None:
            return model.open_session(max_length=max_length, batch_size=batch_size)
        held = pool.take(prompt, max_length)
        if held is not None:
            return held
        try:  # room for the next turn, where the servers allow it
            return model.open_session(max_length=max_length + headroom_tokens, batch_size=1)
        except LengthExceeded:
            return model.open_session(max_length=max_length, batch_size=1)

    @contextlib.contextmanager
    def sessions(max_length: int, batch_size: int,
                 prompt: Sequence[int] | None = None) -> Iterator[OpenedSessions]:  # fmt: skip
        session = open_session(max_length, batch_size, prompt)

        def route() -> tuple[ServedSpan, ...]:
            return tuple(
                ServedSpan(s.hop.peer_id, s.hop.addr, s.hop.start_block, s.hop.end_block)
                for s in session.spans
            )

        try:
            yield OpenedSessions({"session": session}, route)
        except BaseException:
            session.close()
            raise
        if pool is not None and prompt is not None:
            pool.put(session)  # closed there unless it can be matched later
        else:
            session.close()

    return CausalLMEngine(model, tokenizer, model_id=model_id, sessions=sessions, **kwargs)
