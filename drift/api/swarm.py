"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation opens its own remote session through the client's public API
(`model.open_session`, then `generate(..., session=s)`), so concurrent requests never share
server-side caches, a cancelled request frees its caches at once, and the session's spans
tell which servers ran the blocks. A request may name a LoRA adapter the swarm serves
("model:adapter"): its sessions ask for it, and routing uses only servers holding it.
With a `SessionPool` (drift.api.prefix), a one-row generation of the base model keeps its
session when it ends cleanly and a later prompt starting with its tokens (the next chat
turn) continues it: only the new tokens are sent. Such sessions are opened
`headroom_tokens` longer than asked, so the next turn fits without reopening. (Sessions of
an adapter are not pooled.) To the servers the API is one client: when one has no room for
a new session, the pool's idle sessions are closed, oldest first, until it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from drift.api.engine import CausalLMEngine, OpenedSessions, ServedSpan
from drift.api.prefix import SessionPool
from drift.client.routing import missing_blocks
from drift.wire.errors import CacheFull, LengthExceeded


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str, pool: SessionPool | None = None,
                 headroom_tokens: int = 512, **kwargs: Any) -> CausalLMEngine:  # fmt: skip
    """An engine over a `DistributedModelForCausalLM` (from drift.client); with `pool`,
    one-row generations continue held sessions sharing their prompt's prefix."""

    def open_new(**kwargs: Any) -> Any:
        """model.open_session; where a server has no room for it (its KV budget, or this
        API's share of it as one client), the API's own idle held sessions give theirs back
        first, least recently used first, before the refusal reaches the request."""
        while True:
            session = model.open_session(**kwargs)
            try:
                session.connect()
                return session
            except CacheFull:
                session.close()
                if pool is None or not pool.release_oldest():
                    raise

    def open_session(max_length: int, batch_size: int, adapter: str | None,
                     prompt: Sequence[int] | None) -> Any:  # fmt: skip
        if pool is None or prompt is None or adapter is not None:
            return open_new(max_length=max_length, batch_size=batch_size, active_adapter=adapter)
        held = pool.take(prompt, max_length)
        if held is not None:
            return held
        try:  # room for the next turn, where the servers allow it
            return open_new(max_length=max_length + headroom_tokens, batch_size=1)
        except (LengthExceeded, CacheFull):  # no room for the headroom: what was asked
            return open_new(max_length=max_length, batch_size=1)

    @contextlib.contextmanager
    def sessions(max_length: int, batch_size: int, adapter: str | None = None,
                 prompt: Sequence[int] | None = None) -> Iterator[OpenedSessions]:  # fmt: skip
        session = open_session(max_length, batch_size, adapter, prompt)

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
        if pool is not None and prompt is not None and adapter is None:
            pool.put(session)  # closed there unless it can be matched later
        else:
            session.close()

    def adapters() -> tuple[str, ...]:  # blocking: refreshes the client's table when stale
        client = model.client
        client.run(client.swarm.refresh())
        return served_adapters(client.swarm.servers(client.model_fingerprint), model.num_blocks)

    return CausalLMEngine(model, tokenizer, model_id=model_id, sessions=sessions,
                          adapters=adapters, **kwargs)  # fmt: skip


def served_adapters(servers: Any, num_blocks: int) -> tuple[str, ...]:
    """The LoRA adapters whose servers (drift.client.routing.ServerInfo) cover every block."""
    names = sorted({name for s in servers for name in s.adapters})
    return tuple(name for name in names
                 if not missing_blocks([s for s in servers if name in s.adapters], 0, num_blocks))  # fmt: skip
