"""BlockServer: what the routes share (backend, sessions, metrics, config) and what it announces.

Holds no torch code itself; `describe()` is the /blocks document and the fields announced
in the membership record. The housekeeping loop reaps idle sessions and re-announces the
cache left when it changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from drift.server.backend import SpanBackend
from drift.server.budget import CacheBudget
from drift.server.config import ServerConfig
from drift.server.metrics import ServerMetrics
from drift.server.sessions import SessionManager

log = logging.getLogger(__name__)


class BlockServer:
    def __init__(
        self, config: ServerConfig, backend: SpanBackend, *, throughput: float,
        announce: Callable[..., None] | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.backend = backend
        self.throughput = throughput  # block-tokens per second of one block
        self.announce = announce  # MembershipNode.announce, or None outside a swarm
        self.budget = CacheBudget(config.attn_cache_tokens, backend.n_blocks)
        self.sessions = SessionManager(
            backend, self.budget, max_length=config.inference_max_length,
            timeout_s=config.session_timeout_s,
        )  # fmt: skip
        self.metrics = ServerMetrics({
            "drift_active_sessions": ("Open inference sessions.", lambda: len(self.sessions.sessions)),
            "drift_cache_tokens_in_use": ("KV-cache block-tokens reserved.", lambda: self.budget.used),
            "drift_cache_tokens_total": ("KV-cache block-tokens in the budget.", lambda: self.budget.total),
        })  # fmt: skip
        self.sockets: set[web.WebSocketResponse] = set()
        self.state = "online"
        self.moving_to: tuple[int, int] | None = None  # the span a running move_to loads

    async def move_to(self, start_block: int, end_block: int, *, ckpt: Any = None,
                      drain_timeout_s: float | None = None) -> None:  # fmt: skip
        """Serve [start_block, end_block) instead: load it, drain old sessions (new ones get
        a retryable `busy`), swap, re-announce (drift.server.move.move_span)."""
        from drift.server.move import DRAIN_TIMEOUT_S, move_span

        timeout = DRAIN_TIMEOUT_S if drain_timeout_s is None else drain_timeout_s
        await move_span(self, start_block, end_block, ckpt=ckpt, drain_timeout_s=timeout)

    def describe(self) -> dict[str, Any]:
        b = self.backend
        return {
            "model": b.model_name,
            "model_fingerprint": b.fingerprint,
            "num_blocks": b.num_model_blocks,
            "start_block": b.start_block,
            "end_block": b.end_block,
            "hidden_size": b.hidden_size,
            "dtype": b.dtype_name,
            "quant": b.quant,
            "throughput": self.throughput,
            "cache_tokens_total": self.budget.tokens_per_block,
            "cache_tokens_left": self.budget.tokens_left,
            "cache_block_tokens_total": self.budget.total,
            "cache_block_tokens_left": self.budget.left,
            "active_sessions": len(self.sessions.sessions),
            "max_batch_size": self.config.max_batch_size,
            "inference_max_length": self.config.inference_max_length,
            "max_body_bytes": self.config.max_body_bytes,
            "state": self.state,
        }

    def record_fields(self) -> dict[str, Any]:
        """The membership-record fields this server announces."""
        d = self.describe()
        keys = ("model", "model_fingerprint", "num_blocks", "start_block", "end_block", "dtype",
                "quant", "throughput", "cache_tokens_left", "cache_tokens_total",
                "active_sessions", "state")  # fmt: skip
        return {"role": "server", **{k: d[k] for k in keys}}

    async def housekeeping_loop(self, tick_s: float = 1.0) -> None:
        last: tuple[int, int] | None = None
        tick = min(tick_s, max(self.config.session_timeout_s / 4, 0.05))
        while True:
            self.sessions.reap()
            now = (self.budget.tokens_left, len(self.sessions.sessions))
            if self.announce is not None and now != last:
                try:
                    self.announce(cache_tokens_left=now[0], active_sessions=now[1])
                except Exception:  # announcing must never stop the reaper
                    log.exception("announce failed")
                last = now
            await asyncio.sleep(tick)
