"""Build the API's engine over a swarm: DRIFT's distributed causal LM plus its tokenizer.

Each generation opens its own remote session through the client's public API
(`model.open_session`, then `generate(..., session=s)`), so concurrent requests never share
server-side caches, a cancelled request frees its caches at once, and the session's spans
tell which servers ran the blocks. A request may name a LoRA adapter the swarm serves
("model:adapter"): its sessions ask for it, and routing uses only servers holding it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from drift.api.engine import CausalLMEngine, OpenedSessions, ServedSpan
from drift.client.routing import missing_blocks


def swarm_engine(model: Any, tokenizer: Any, *, model_id: str, **kwargs: Any) -> CausalLMEngine:
    """An engine over a `DistributedModelForCausalLM` (from drift.client)."""

    @contextlib.contextmanager
    def sessions(max_length: int, batch_size: int, adapter: str | None) -> Iterator[OpenedSessions]:
        session = model.open_session(max_length=max_length, batch_size=batch_size,
                                     active_adapter=adapter)  # fmt: skip

        def route() -> tuple[ServedSpan, ...]:
            return tuple(
                ServedSpan(s.hop.peer_id, s.hop.addr, s.hop.start_block, s.hop.end_block)
                for s in session.spans
            )

        try:
            yield OpenedSessions({"session": session}, route)
        finally:
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
