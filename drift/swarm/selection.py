"""Which span a server should serve: pure functions on lists of records.

`choose_span` picks the span where the swarm is weakest (missing blocks first, then the
lowest throughput). `choose_rebalance` moves a server only when the swarm is badly
unbalanced, the move helps, and every block it serves now stays covered by others.
"""

from __future__ import annotations

from drift.swarm.coverage import block_throughputs
from drift.swarm.record import PeerRecord
from drift.wire.errors import BadRequest


def _best_start(throughputs: list[float], n_blocks: int) -> int:
    """Start of the window with most missing blocks, then lowest min, then lowest sum."""
    num_blocks = len(throughputs)
    if not 0 < n_blocks <= num_blocks:
        raise BadRequest(f"cannot serve {n_blocks} blocks of a model with {num_blocks}")

    def key(start: int) -> tuple[int, float, float, int]:
        window = throughputs[start : start + n_blocks]
        return (-sum(1 for t in window if t <= 0), min(window), sum(window), start)

    return min(range(num_blocks - n_blocks + 1), key=key)


def choose_span(records: list[PeerRecord], num_blocks: int, n_blocks: int) -> tuple[int, int]:
    """[start_block, end_block) of `n_blocks` where the swarm's throughput is lowest.

    `records` should be the live records of one model (others' spans count as given).
    """
    start = _best_start(block_throughputs(records, num_blocks), n_blocks)
    return start, start + n_blocks


def balance_ratio(throughputs: list[float]) -> float:
    """min/max block throughput (1.0 = perfectly even, 0.0 = a block is missing)."""
    top = max(throughputs, default=0.0)
    return min(throughputs) / top if top > 0 else 0.0


def choose_rebalance(
    records: list[PeerRecord],
    peer_id: str,
    num_blocks: int,
    *,
    min_ratio: float = 0.5,
    min_gain: float = 1.2,
) -> tuple[int, int] | None:
    """The span `peer_id` should move to, or None to stay.

    Moves only when min/max block throughput is below `min_ratio`, the swarm's weakest
    block gets at least `min_gain` times faster (or a missing block gets covered), and no
    block the server serves now is left without another server.
    """
    me = next((r for r in records if r.peer_id == peer_id and r.state == "online"), None)
    if me is None or me.span is None:
        return None
    start, end = me.span
    current = block_throughputs(records, num_blocks)
    if balance_ratio(current) >= min_ratio:
        return None
    others = [r for r in records if r.peer_id != peer_id]
    without = block_throughputs(others, num_blocks)
    others_serving = [any(r.serves(b) for r in others) for b in range(num_blocks)]
    if not all(others_serving[start:end]):
        return None  # moving would leave a gap
    new_start = _best_start(without, end - start)
    if new_start == start:
        return None
    moved = list(without)
    for b in range(new_start, new_start + end - start):
        moved[b] += float(me.throughput)
    old_min, new_min = min(current), min(moved)
    improves = (
        new_min > old_min * min_gain
        if old_min > 0
        else (sum(1 for t in moved if t <= 0) < sum(1 for t in current if t <= 0))
    )
    return (new_start, new_start + end - start) if improves else None
