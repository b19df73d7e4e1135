"""SpanRuntime: what serving one span takes at run time, swapped as one object on a move.

The loaded span with its compute thread (SpanBackend), the KV-cache budget sized for it,
and the sessions reserving from that budget. Knows nothing about HTTP or the swarm.
"""

from __future__ import annotations

from dataclasses import dataclass

from drift.server.backend import SpanBackend
from drift.server.budget import CacheBudget
from drift.server.config import ServerConfig
from drift.server.sessions import SessionManager
from drift.server.watchdog import ComputeWatchdog


@dataclass
class SpanRuntime:
    backend: SpanBackend
    budget: CacheBudget
    sessions: SessionManager
    watchdog: ComputeWatchdog  # whether this span's compute thread still advances

    @classmethod
    def build(cls, backend: SpanBackend, config: ServerConfig) -> SpanRuntime:
        budget = CacheBudget(config.attn_cache_tokens, backend.n_blocks)
        sessions = SessionManager(backend, budget, max_length=config.inference_max_length,
                                  timeout_s=config.session_timeout_s,
                                  client_share=config.client_cache_share,
                                  batch_wait_s=config.batch_wait_ms / 1e3)  # fmt: skip
        return cls(backend, budget, sessions, ComputeWatchdog(backend.executor, config.watchdog_s))

    def close(self) -> None:
        """Close every session and stop the compute thread (queued work is dropped)."""
        self.sessions.close_all()
        self.backend.close()
