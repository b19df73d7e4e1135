"""The background loops of `drift up`: coverage reports and re-balancing.

The coverage loop prints which blocks are missing whenever that changes (peers joining and
leaving). The balance loop asks drift.swarm.selection whether this server should move;
BlockServer.move_to loads the new span first, drains live sessions, then swaps and
re-announces, so no gap is ever left. A machine whose budget (drift.cli._budget) has no room
for both spans (one `drift up` filled) drains, unloads the old span, then loads the new one:
only off blocks others serve too, so again no gap. A move that does not fit even then is not
made: the kernel would kill the server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drift.node import MembershipNode
from drift.server.handoff import hand_over_all
from drift.swarm import choose_rebalance, coverage, format_ranges, records_for_model
from drift.waits import raise_if_cancelling
from drift.wire.errors import Busy

if TYPE_CHECKING:  # torch: imported when a server really starts, not for `drift --help`
    from drift.server.state import BlockServer

log = logging.getLogger(__name__)
COVERAGE_TICK_S = 1.0


@dataclass(frozen=True)
class BalanceConfig:
    min_ratio: float  # move when min/max block throughput falls below this
    mean_period_s: float  # mean seconds between balance checks
    max_memory: int | None = None  # --max_memory, bytes: the budget a move must fit in


def start_loops(node: MembershipNode, server: BlockServer, ckpt: Any,
                balance: BalanceConfig | None) -> list[asyncio.Task[None]]:  # fmt: skip
    """Start the loops on the running event loop; they end when the process stops."""
    tasks = [asyncio.create_task(coverage_loop(node, server.backend.fingerprint))]
    if balance is not None:
        tasks.append(asyncio.create_task(balance_loop(node, server, ckpt, balance)))
    return tasks


def missing_message(missing: tuple[int, ...], num_blocks: int) -> str:
    if not missing:
        return f"all {num_blocks} blocks are served: the swarm can run the model"
    return f"blocks missing: {format_ranges(missing)} ({len(missing)} of {num_blocks}); " \
        "start more servers with the join command above"  # fmt: skip


async def coverage_loop(node: MembershipNode, fingerprint: str) -> None:
    last: tuple[int, ...] | None = None
    while True:
        cov = coverage(node.live_records(), fingerprint)
        if cov.missing != last:
            print(missing_message(cov.missing, cov.num_blocks or 0), flush=True)
            last = cov.missing
        await asyncio.sleep(COVERAGE_TICK_S)


async def balance_loop(node: MembershipNode, server: BlockServer, ckpt: Any,
                       balance: BalanceConfig) -> None:  # fmt: skip
    while True:
        await asyncio.sleep(balance.mean_period_s * random.uniform(0.5, 1.5))
        try:
            await balance_once(node, server, ckpt, min_ratio=balance.min_ratio,
                               max_memory=balance.max_memory)  # fmt: skip
        except Exception:  # a failed move keeps serving the old span
            log.exception("re-balancing failed; still serving the old blocks")
        raise_if_cancelling()


def rebalance_target(node: MembershipNode, server: BlockServer, *,
                     min_ratio: float) -> tuple[int, int] | None:  # fmt: skip
    """Where this server should move, from the node's live records of its model (or None)."""
    b = server.backend
    records = records_for_model(node.live_records(), b.fingerprint)
    return choose_rebalance(records, node.peer_id, b.num_model_blocks, min_ratio=min_ratio)


def move_shortfall_now(server: BlockServer, target: tuple[int, int], *,
                       max_memory: int | None, free_bytes: int | None = None) -> int:  # fmt: skip
    """Bytes this machine lacks to load `target` beside the span it serves (0: it fits).
    `free_bytes`: the budget left (default: read now, as drift up sized the server)."""
    from drift.cli._budget import read_budget
    from drift.cli._capacity import move_shortfall

    span = server.backend.span
    if free_bytes is None:
        free_bytes = read_budget(span.device, max_memory=max_memory).available
    return move_shortfall(span.config, span.device, span.dtype, quant=span.quant,
                          blocks=range(*target), cache_tokens=server.config.attn_cache_tokens,
                          free_bytes=free_bytes)  # fmt: skip


async def balance_once(node: MembershipNode, server: BlockServer, ckpt: Any, *,
                       min_ratio: float, drain_timeout_s: float | None = None,
                       max_memory: int | None = None, free_bytes: int | None = None,
                       settle_s: float | None = None) -> tuple[int, int] | None:  # fmt: skip
    """One balance check: move (BlockServer.move_to) when the swarm is unbalanced; the target.
    The new span loads beside the old one when both fit in the budget (`free_bytes`, default:
    read now); else, when it fits once the old span is freed, the old span is unloaded first
    (drift.cli._capacity.swap_shortfall; choose_rebalance moves only off blocks others serve
    too; `settle_s` after announcing `draining`, default two gossip rounds, they must still:
    two servers of the same blocks deciding at once call it off)."""
    target = rebalance_target(node, server, min_ratio=min_ratio)
    if target is None:
        return None
    b = server.backend
    if free_bytes is None:
        from drift.cli._budget import read_budget

        free_bytes = read_budget(b.span.device, max_memory=max_memory).available
    from drift.cli._capacity import swap_shortfall

    make_room = move_shortfall_now(server, target, max_memory=max_memory, free_bytes=free_bytes) > 0
    if make_room:
        span = b.span
        short = swap_shortfall(span.config, span.device, span.dtype, quant=span.quant,
                               old_blocks=range(b.start_block, b.end_block),
                               new_blocks=range(*target),
                               cache_tokens=server.config.attn_cache_tokens,
                               free_bytes=free_bytes)  # fmt: skip
        if short:
            log.warning("the swarm is unbalanced, but blocks [%d, %d) do not fit here even "
                        "without blocks [%d, %d) (%.2f GiB short): staying", target[0], target[1],
                        b.start_block, b.end_block, short / (1 << 30))  # fmt: skip
            return None
    how = " (no room for both: unloading the old blocks first; others serve them)" * make_room
    print(f"the swarm is unbalanced: moving from blocks [{b.start_block}, {b.end_block}) "
          f"to [{target[0]}, {target[1]}){how}", flush=True)  # fmt: skip
    settle = 2 * node.config.gossip_interval_s if settle_s is None else settle_s
    try:
        await server.move_to(*target, ckpt=ckpt, drain_timeout_s=drain_timeout_s,
                             make_room=make_room,
                             before_drain=functools.partial(hand_over_all, server, node),
                             confirm=functools.partial(others_serve, node, server, settle))  # fmt: skip
    except Busy as exc:
        print(f"not moving: {exc}", flush=True)
        return None
    print(f"now serving blocks [{target[0]}, {target[1]})", flush=True)
    return target


async def others_serve(node: MembershipNode, server: BlockServer, settle_s: float) -> bool:
    """After `settle_s` (for records to spread), whether every block this server holds is
    served by another live server of the model (not draining, not degraded)."""
    await asyncio.sleep(settle_s)
    b = server.backend
    others = [r for r in records_for_model(node.live_records(), b.fingerprint)
              if r.peer_id != node.peer_id]  # fmt: skip
    return all(any(r.serves(i) for r in others) for i in range(b.start_block, b.end_block))
