"""Moving a running block server to another span: load, drain, then swap; or, on a machine
with no room for both spans, drain, unload, then load.

`prepare_move`: the new span is loaded next to the old one (off the event loop) into a new
SpanRuntime; from then on new sessions on the old one are refused with a retryable `busy`
error while its live sessions finish (or the drain timeout closes them). The caller
(BlockServer) swaps the runtimes with no await in between and announces. A failed load
leaves the old span serving as before.

`make_room` then `load_runtime`: for a machine that holds one span only (its budget filled
at start-up). The old span is drained the same way, then its weights are freed (its compute
refused with a retryable `busy`), then the new span loads. Only for a span that other
servers also serve (drift.swarm.selection.choose_rebalance moves no other): its blocks stay
covered while this server loads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from drift.models.checkpoint import Checkpoint, open_checkpoint
from drift.models.span import ModelSpan
from drift.openmp import worker_release
from drift.server.adapters import load_adapters
from drift.server.backend import SpanBackend
from drift.server.compiled import attach_decode
from drift.server.config import ServerConfig
from drift.server.products import attach_row_kernel
from drift.server.runtime import SpanRuntime
from drift.server.sessions import SessionManager

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 120.0  # seconds live sessions may keep the old span before they are closed
DRAIN_TICK_S = 0.05  # seconds between checks for drained sessions


async def prepare_move(current: SpanRuntime, config: ServerConfig, start_block: int,
                       end_block: int, *, ckpt: Checkpoint | None, drain_timeout_s: float,
                       before_drain: Callable[[float], Awaitable[object]] | None = None,
                       ) -> SpanRuntime:  # fmt: skip
    """Load [start_block, end_block) beside `current`, then drain `current`'s sessions; the
    new runtime to swap in. `before_drain(deadline)`, once new sessions are refused: hand the
    live ones over (drift.server.handoff) by that loop time. Cancelled or failed: `current`
    keeps serving, accepting again."""
    backend = await _load_backend(current.backend, config, ckpt, start_block, end_block)
    try:
        await _refuse_and_drain(current, start_block, end_block, drain_timeout_s, before_drain)
    except BaseException:  # cancelled: keep serving the old span, accepting sessions again
        current.sessions.refusing = None
        backend.executor.shutdown(wait=False)
        raise
    return SpanRuntime.build(backend, config)


async def make_room(current: SpanRuntime, start_block: int, end_block: int, *,
                    drain_timeout_s: float,
                    before_drain: Callable[[float], Awaitable[object]] | None = None,
                    ) -> None:  # fmt: skip
    """Drain `current` as `prepare_move` does, close what is left, then free its weights;
    `load_runtime` next. Cancelled while draining: `current` keeps serving."""
    try:
        await _refuse_and_drain(current, start_block, end_block, drain_timeout_s, before_drain)
    except BaseException:
        current.sessions.refusing = None
        raise
    current.sessions.close_all()
    reason = (f"this server is loading blocks [{start_block}, {end_block}); its old blocks are "
              "served by others: retry there")  # fmt: skip
    # off the event loop: unload waits for the compute running now
    await asyncio.get_running_loop().run_in_executor(None, current.backend.unload, reason)
    log.info("unloaded blocks [%d, %d) to make room for [%d, %d)", current.backend.start_block,
             current.backend.end_block, start_block, end_block)  # fmt: skip


async def load_runtime(old: SpanBackend, config: ServerConfig, start_block: int, end_block: int,
                       *, ckpt: Checkpoint | None) -> SpanRuntime:  # fmt: skip
    """[start_block, end_block) loaded as a new runtime in `old`'s dtype, device, quantization
    and pace (after `make_room`, or to load `old`'s own blocks back)."""
    return SpanRuntime.build(await _load_backend(old, config, ckpt, start_block, end_block),
                             config)  # fmt: skip


async def _load_backend(old: SpanBackend, config: ServerConfig, ckpt: Checkpoint | None,
                        start_block: int, end_block: int) -> SpanBackend:  # fmt: skip
    loop = asyncio.get_running_loop()
    # Loaded on the default executor: the old span keeps computing on its own thread.
    span = await loop.run_in_executor(None, _load, config, old, ckpt, start_block, end_block)
    chunk = old.chunk_tokens  # the same pace per block: units sized for the new span's length
    if old.sized_by_pace and old.pace is not None:
        chunk = old.sized_chunk(end_block - start_block)
    backend = SpanBackend(span, model_name=old.model_name, fingerprint=old.fingerprint,
                          max_batch_size=old.max_batch_size, quant=old.quant,
                          max_request_tokens=old.max_request_tokens,
                          chunk_tokens=chunk, pace=old.pace, sized_by_pace=old.sized_by_pace,
                          prompt_pace=old.prompt_pace)  # fmt: skip
    await loop.run_in_executor(None, attach_decode, backend, config.compile)
    # decode steps' threads and row pads as measured at start-up (the old span computes beside
    # a new measurement: it would time both)
    backend.decode_threads, backend.batch_threads = old.decode_threads, old.batch_threads
    backend.decode_status |= {k: v for k, v in old.decode_status.items()
                              if "threads" in k or k in ("products", "batch_rows")}  # fmt: skip
    if backend.decode is not None:  # from what /blocks showed: a move may unload the old first
        backend.decode_status |= {k: v for k, v in old.decode_status.items() if k.startswith("row")}
        shown = old.decode_status.get("row_pads", {})
        backend.decode.decoder.row_pads = {int(m): int(to) for m, to in shown.items()}
    return backend


async def _refuse_and_drain(current: SpanRuntime, start_block: int, end_block: int,
                            drain_timeout_s: float,
                            before_drain: Callable[[float], Awaitable[object]] | None,
                            ) -> None:  # fmt: skip
    """New sessions refused (retryably), live ones handed over (`before_drain`) or let finish
    by the drain timeout."""
    loop = asyncio.get_running_loop()
    current.sessions.refusing = (
        f"this server is moving to blocks [{start_block}, {end_block}); open the session "
        "on another server or retry here in a moment"
    )
    deadline = loop.time() + drain_timeout_s
    if before_drain is not None:
        await before_drain(deadline)
    await _drain(current.sessions, deadline)


def _load(config: ServerConfig, old: SpanBackend, ckpt: Checkpoint | None, start_block: int,
          end_block: int) -> ModelSpan:  # fmt: skip
    """The new span in the old one's dtype, device and quantization (a move changes blocks
    only)."""
    span = old.span
    if ckpt is None:
        ckpt = open_checkpoint(config.model, cache_dir=config.cache_dir, revision=config.revision,
                               dtype=span.dtype)  # fmt: skip
    new = ModelSpan.load(ckpt, start_block, end_block, dtype=span.dtype, device=span.device,
                         quant=span.quant)  # fmt: skip
    load_adapters(new, config.adapters)
    attach_row_kernel(new, config)  # as the old span's (decode.products, copied below)
    worker_release()()  # this executor thread's OpenMP pool would throttle the compute pool's
    return new


async def _drain(sessions: SessionManager, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    while sessions.sessions and loop.time() < deadline:
        await asyncio.sleep(DRAIN_TICK_S)
    if sessions.sessions:
        log.warning("drain timeout: closing %d live session(s) on the old span",
                    len(sessions.sessions))  # fmt: skip
