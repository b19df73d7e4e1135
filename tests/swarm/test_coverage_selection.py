"""Coverage and block selection on hand-built tables."""

from __future__ import annotations

import pytest

from drift.swarm import (
    balance_ratio,
    block_throughputs,
    choose_rebalance,
    choose_span,
    coverage,
)
from drift.wire.errors import BadRequest, NotFound
from tests.swarm.swarm_helpers import make_record


def test_coverage_sums_throughput_and_lists_missing() -> None:
    a = make_record(span=(0, 4), throughput=2.0)
    b = make_record(span=(2, 6), throughput=3.0)
    off = make_record(span=(6, 8), throughput=9.0, state="offline")
    dht = make_record()
    cov = coverage([a, b, off, dht]).to_wire()
    assert cov["model_fingerprint"] == "f00d" and cov["num_blocks"] == 8
    assert [blk["throughput"] for blk in cov["blocks"]] == [2, 2, 5, 5, 3, 3, 0, 0]
    assert set(cov["blocks"][2]["peers"]) == {a.peer_id, b.peer_id}
    assert cov["missing"] == [6, 7]
    assert coverage([a], "tiny").to_wire()["missing"] == [4, 5, 6, 7]


def test_coverage_empty_unknown_and_ambiguous() -> None:
    assert coverage([make_record()]).to_wire()["model"] is None
    with pytest.raises(NotFound, match="no server"):
        coverage([make_record(span=(0, 1))], "other")
    two = [make_record(span=(0, 1)), make_record(span=(0, 1), fingerprint="beef")]
    with pytest.raises(NotFound, match="2 models"):
        coverage(two)
    assert coverage(two, "beef").to_wire()["blocks"][0]["peers"] == [two[1].peer_id]


def test_choose_span_missing_first_then_weakest() -> None:
    assert choose_span([], 8, 3) == (0, 3)
    recs = [make_record(span=(0, 4), throughput=1.0)]
    assert choose_span(recs, 8, 4) == (4, 8)
    assert choose_span(recs, 8, 2) == (4, 6)
    # everything covered: the window with the lowest throughput
    recs += [make_record(span=(4, 8), throughput=10.0), make_record(span=(0, 2), throughput=5)]
    assert block_throughputs(recs, 8) == [6, 6, 1, 1, 10, 10, 10, 10]
    assert choose_span(recs, 8, 2) == (2, 4)
    with pytest.raises(BadRequest):
        choose_span(recs, 8, 9)


def test_rebalance_moves_only_when_unbalanced_and_gap_free() -> None:
    # blocks 0-3: two fast servers; blocks 4-7: one slow one -> badly unbalanced
    mover = make_record(span=(0, 4), throughput=10.0)
    stay = make_record(span=(0, 4), throughput=10.0)
    slow = make_record(span=(4, 8), throughput=1.0)
    recs = [mover, stay, slow]
    assert balance_ratio(block_throughputs(recs, 8)) == pytest.approx(0.05)
    assert choose_rebalance(recs, mover.peer_id, 8) == (4, 8)
    assert choose_rebalance(recs, mover.peer_id, 8) is not None
    # the only server of blocks 4-7 must never move (it would leave a gap)
    assert choose_rebalance(recs, slow.peer_id, 8) is None
    # without the second server, moving the first would uncover 0-3
    assert choose_rebalance([mover, slow], mover.peer_id, 8) is None
    # balanced enough: nobody moves
    even = [mover, stay, make_record(span=(4, 8), throughput=15.0)]
    assert choose_rebalance(even, mover.peer_id, 8) is None


def test_rebalance_covers_missing_blocks_without_gaps() -> None:
    a = make_record(span=(0, 4), throughput=3.0)
    b = make_record(span=(0, 4), throughput=3.0)
    assert choose_rebalance([a, b], a.peer_id, 8) == (4, 8)
    # a move that does not improve the weakest block is refused
    c = make_record(span=(0, 2), throughput=1.0)
    d = make_record(span=(0, 2), throughput=1.0)
    e = make_record(span=(2, 8), throughput=1.0)
    f = make_record(span=(2, 8), throughput=1.0)
    assert choose_rebalance([c, d, e, f], c.peer_id, 8, min_ratio=1.1) is None
