"""The background loops of `drift up`: coverage reports and re-balancing.

The coverage loop prints which blocks are missing whenever that changes (peers joining and
leaving). The balance loop asks drift.swarm.selection whether this server should move; a
move loads the new span first, drains live sessions, then swaps, so no gap is ever left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)
COVERAGE_TICK_S = 1.0
DRAIN_TIMEOUT_S = 120.0


def start_loops(app: web.Application, node: Any, server: Any, ckpt: Any,
                args: argparse.Namespace) -> list[asyncio.Task[None]]:  # fmt: skip
    """Start the loops on the running event loop; they end when the process stops."""
    tasks = [asyncio.create_task(coverage_loop(node, server.backend.fingerprint))]
    if args.balance_quality > 0 and args.block_indices is None:
        tasks.append(asyncio.create_task(balance_loop(node, server, ckpt, args)))
    return tasks


def missing_message(missing: list[int], num_blocks: int) -> str:
    from drift.cli.status import block_ranges

    if not missing:
        return f"all {num_blocks} blocks are served: the swarm can run the model"
    return f"blocks missing: {block_ranges(missing)} ({len(missing)} of {num_blocks}); " \
        "start more servers with the join command above"  # fmt: skip


async def coverage_loop(node: Any, fingerprint: str) -> None:
    from drift.swarm.coverage import coverage

    last: list[int] | None = None
    while True:
        cov = coverage(node.live_records(), fingerprint)
        missing = list(cov.get("missing") or [])
        if missing != last:
            print(missing_message(missing, int(cov.get("num_blocks") or 0)), flush=True)
            last = missing
        await asyncio.sleep(COVERAGE_TICK_S)


async def balance_loop(node: Any, server: Any, ckpt: Any, args: argparse.Namespace) -> None:
    from drift.swarm.coverage import records_for_model
    from drift.swarm.selection import choose_rebalance

    period = args.mean_balance_check_period
    while True:
        await asyncio.sleep(period * random.uniform(0.5, 1.5))
        b = server.backend
        records = records_for_model(node.live_records(), b.fingerprint)
        target = choose_rebalance(records, node.peer_id, b.num_model_blocks,
                                  min_ratio=args.balance_quality)  # fmt: skip
        if target is None:
            continue
        print(f"the swarm is unbalanced: moving from blocks [{b.start_block}, {b.end_block}) "
              f"to [{target[0]}, {target[1]})", flush=True)  # fmt: skip
        try:
            await move_span(node, server, ckpt, *target)
        except Exception:  # a failed move keeps serving the old span
            log.exception("re-balancing failed; still serving the old blocks")


async def move_span(node: Any, server: Any, ckpt: Any, start: int, end: int) -> None:
    """Load [start, end) alongside the old span, drain sessions, then swap and announce."""
    from drift.models.span import ModelSpan
    from drift.server.backend import SpanBackend
    from drift.server.budget import CacheBudget
    from drift.server.sessions import SessionManager

    old = server.backend
    loop = asyncio.get_running_loop()
    span = await loop.run_in_executor(
        old.executor, lambda: ModelSpan.load(ckpt, start, end, dtype=old.span.dtype,
                                             device=old.span.device),
    )  # fmt: skip
    backend = SpanBackend(span, model_name=old.model_name, fingerprint=old.fingerprint,
                          max_batch_size=old.max_batch_size, quant=old.quant)  # fmt: skip
    deadline = loop.time() + DRAIN_TIMEOUT_S
    while server.sessions.sessions and loop.time() < deadline:
        await asyncio.sleep(0.5)  # live sessions finish on the old span
    cfg = server.config
    server.backend = backend
    server.budget = CacheBudget(cfg.attn_cache_tokens, backend.n_blocks)
    old_sessions = server.sessions
    server.sessions = SessionManager(backend, server.budget, max_length=cfg.inference_max_length,
                                     timeout_s=cfg.session_timeout_s)  # fmt: skip
    with contextlib.suppress(Exception):
        old_sessions.close_all()
    node.announce(**server.record_fields())
    old.close()
    print(f"now serving blocks [{start}, {end})", flush=True)
