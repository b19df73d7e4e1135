"""Moving a running block server to another span without a gap: load, drain, swap, announce.

The new span is loaded next to the old one (off the event loop); from then on new sessions
are refused with a retryable `busy` error while the old span's live sessions finish (or the
drain timeout closes them); then backend, cache budget and session manager are swapped in
one step on the event loop and the new span is announced. A failed load leaves the old
span serving as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from drift.server.backend import SpanBackend
from drift.server.budget import CacheBudget
from drift.server.sessions import SessionManager
from drift.wire.errors import BadRequest, Busy

if TYPE_CHECKING:
    from drift.server.state import BlockServer

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 120.0  # seconds live sessions may keep the old span before they are closed
DRAIN_TICK_S = 0.05  # seconds between checks for drained sessions


async def move_span(server: BlockServer, start_block: int, end_block: int, *, ckpt: Any = None,
                    drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:  # fmt: skip
    """Serve [start_block, end_block) instead of the current span (see the module doc).

    `ckpt` is the open Checkpoint of the served model (opened from the config when None).
    Raises BadRequest for a span outside the model, Busy while another move runs.
    """
    old = server.backend
    if not 0 <= start_block < end_block <= old.num_model_blocks:
        raise BadRequest(f"cannot move to blocks [{start_block}, {end_block}): the model has "
                         f"{old.num_model_blocks} blocks")  # fmt: skip
    if server.moving_to is not None:
        raise Busy(f"already moving to blocks {list(server.moving_to)}")
    server.moving_to = (start_block, end_block)
    try:
        loop = asyncio.get_running_loop()
        # Loaded on the default executor: the old span keeps computing on its own thread.
        span = await loop.run_in_executor(None, _load, server, ckpt, start_block, end_block)
        backend = SpanBackend(span, model_name=old.model_name, fingerprint=old.fingerprint,
                              max_batch_size=old.max_batch_size, quant=old.quant)  # fmt: skip
        old_sessions = server.sessions
        old_sessions.refusing = (
            f"this server is moving to blocks [{start_block}, {end_block}); open the session "
            "on another server or retry here in a moment"
        )
        try:
            await _drain(old_sessions, loop.time() + drain_timeout_s)
        except BaseException:  # cancelled: keep serving the old span, accepting sessions again
            old_sessions.refusing = None
            backend.executor.shutdown(wait=False)
            raise
        _swap(server, backend)  # no await in between: requests see the old or the new span
        old_sessions.close_all()
        old.executor.shutdown(wait=False)  # requests already queued on the old span finish
    finally:
        server.moving_to = None
    if server.announce is not None:
        server.announce(**server.record_fields())
    log.info("moved from blocks [%d, %d) to [%d, %d)", old.start_block, old.end_block,
             start_block, end_block)  # fmt: skip


def _load(server: BlockServer, ckpt: Any, start_block: int, end_block: int) -> Any:
    from drift.models.checkpoint import open_checkpoint
    from drift.models.span import ModelSpan

    cfg = server.config
    old = server.backend.span
    if ckpt is None:
        ckpt = open_checkpoint(cfg.model, cache_dir=cfg.cache_dir, revision=cfg.revision,
                               dtype=old.dtype)  # fmt: skip
    return ModelSpan.load(ckpt, start_block, end_block, dtype=old.dtype, device=old.device,
                          quant=old.quant)  # fmt: skip


async def _drain(sessions: SessionManager, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    while sessions.sessions and loop.time() < deadline:
        await asyncio.sleep(DRAIN_TICK_S)
    if sessions.sessions:
        log.warning("drain timeout: closing %d live session(s) on the old span",
                    len(sessions.sessions))  # fmt: skip


def _swap(server: BlockServer, backend: SpanBackend) -> None:
    cfg = server.config
    budget = CacheBudget(cfg.attn_cache_tokens, backend.n_blocks)
    server.backend = backend
    server.budget = budget
    server.sessions = SessionManager(backend, budget, max_length=cfg.inference_max_length,
                                     timeout_s=cfg.session_timeout_s)  # fmt: skip
