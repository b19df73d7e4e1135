"""The background loops of `drift up`: coverage reports and re-balancing.

The coverage loop prints which blocks are missing whenever that changes (peers joining and
leaving). The balance loop asks drift.swarm.selection whether this server should move;
BlockServer.move_to loads the new span first, drains live sessions, then swaps and
re-announces, so no gap is ever left.
"""

from __future__ import annotations

import argparse
import asyncio
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
    period = args.mean_balance_check_period
    while True:
        await asyncio.sleep(period * random.uniform(0.5, 1.5))
        try:
            await balance_once(node, server, ckpt, min_ratio=args.balance_quality)
        except Exception:  # a failed move keeps serving the old span
            log.exception("re-balancing failed; still serving the old blocks")


def rebalance_target(node: Any, server: Any, *, min_ratio: float) -> tuple[int, int] | None:
    """Where this server should move, from the node's live records of its model (or None)."""
    from drift.swarm.coverage import records_for_model
    from drift.swarm.selection import choose_rebalance

    b = server.backend
    records = records_for_model(node.live_records(), b.fingerprint)
    return choose_rebalance(records, node.peer_id, b.num_model_blocks, min_ratio=min_ratio)


async def balance_once(node: Any, server: Any, ckpt: Any, *, min_ratio: float,
                       drain_timeout_s: float = DRAIN_TIMEOUT_S) -> tuple[int, int] | None:  # fmt: skip
    """One balance check: move (BlockServer.move_to) when the swarm is unbalanced; the target."""
    target = rebalance_target(node, server, min_ratio=min_ratio)
    if target is None:
        return None
    b = server.backend
    print(f"the swarm is unbalanced: moving from blocks [{b.start_block}, {b.end_block}) "
          f"to [{target[0]}, {target[1]})", flush=True)  # fmt: skip
    await server.move_to(*target, ckpt=ckpt, drain_timeout_s=drain_timeout_s)
    print(f"now serving blocks [{target[0]}, {target[1]})", flush=True)
    return target
