"""Routing on hand-made tables: latency-optimal chains, spreading by throughput, bans."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from drift.client.bans import BanList
from drift.client.routing import (
    Hop,
    LatencyModel,
    ServerInfo,
    inference_route,
    missing_blocks,
    spread_route,
)
from drift.wire.errors import MissingBlocks


def srv(pid, start, end, tp=100.0, cache=10_000, rtt=0.01):
    return ServerInfo(pid, f"http://{pid}", start, end, tp, cache, rtt)


def test_single_server_covers_all():
    route = inference_route([srv("a", 0, 8)], 0, 8)
    assert route == [Hop("a", "http://a", 0, 8)]


def test_prefers_fewer_hops_when_equal():
    table = [srv("a", 0, 8), srv("b", 0, 4), srv("c", 4, 8)]
    assert [h.peer_id for h in inference_route(table, 0, 8)] == ["a"]


def test_prefers_fast_chain_over_slow_single_server():
    table = [srv("slow", 0, 8, tp=1.0), srv("b", 0, 4, tp=1000), srv("c", 4, 8, tp=1000)]
    route = inference_route(table, 0, 8)
    assert [(h.peer_id, h.start_block, h.end_block) for h in route] == [("b", 0, 4), ("c", 4, 8)]


def test_high_rtt_avoided():
    table = [srv("far", 0, 8, rtt=5.0), srv("near", 0, 8, rtt=0.001)]
    assert inference_route(table, 0, 8)[0].peer_id == "near"


def test_cache_penalty_moves_session_elsewhere():
    table = [srv("full", 0, 8, tp=1000, cache=10), srv("roomy", 0, 8, tp=100, cache=10_000)]
    model = LatencyModel(cache_tokens_needed=64)
    assert inference_route(table, 0, 8, model)[0].peer_id == "roomy"
    assert inference_route(table, 0, 8)[0].peer_id == "full"


def test_overlapping_spans_are_split_at_best_point():
    table = [srv("a", 0, 6, tp=1000), srv("b", 3, 8, tp=1000)]
    route = inference_route(table, 0, 8)
    assert route[0].start_block == 0 and route[-1].end_block == 8
    assert all(x.end_block == y.start_block for x, y in zip(route, route[1:], strict=False))
    assert len(route) == 2


def test_sub_span():
    route = inference_route([srv("a", 0, 8)], 3, 5)
    assert route == [Hop("a", "http://a", 3, 5)]


def test_missing_blocks_named():
    table = [srv("a", 0, 3), srv("b", 5, 8)]
    assert missing_blocks(table, 0, 8) == [3, 4]
    with pytest.raises(MissingBlocks, match="3-4") as info:
        inference_route(table, 0, 8)
    assert info.value.details["missing"] == [3, 4]
    with pytest.raises(MissingBlocks):
        spread_route(table, 0, 8)


def test_spread_follows_throughput():
    table = [srv("a", 0, 4, tp=300), srv("b", 0, 4, tp=100)]
    rng = random.Random(0)
    counts = Counter(spread_route(table, 0, 4, rng)[0].peer_id for _ in range(2000))
    assert 0.70 < counts["a"] / 2000 < 0.80


def test_spread_chain_is_contiguous():
    table = [srv("a", 0, 5), srv("b", 2, 8), srv("c", 5, 8)]
    for seed in range(20):
        route = spread_route(table, 0, 8, random.Random(seed))
        assert route[0].start_block == 0 and route[-1].end_block == 8
        assert all(x.end_block == y.start_block for x, y in zip(route, route[1:], strict=False))


def test_ban_backoff_and_reset():
    now = [0.0]
    bans = BanList(base_s=1.0, max_s=5.0, clock=lambda: now[0])
    assert bans.ban("a") == 1.0
    assert bans.is_banned("a")
    now[0] = 1.5
    assert not bans.is_banned("a")
    assert bans.ban("a") == 2.0
    assert bans.ban("a") == 4.0
    assert bans.ban("a") == 5.0
    assert bans.banned() == {"a"}
    bans.success("a")
    assert not bans.is_banned("a") and bans.ban("a") == 1.0


def test_latency_ewma_update():
    from drift.client.latency import LatencyEwma

    ewma = LatencyEwma(alpha=0.5)
    assert ewma.get("a") is None
    assert ewma.update("a", 0.2) == 0.2  # first sample taken as is
    assert ewma.update("a", 0.4) == pytest.approx(0.3)
    assert ewma.update("a", 0.0) == pytest.approx(0.15)
    assert ewma.samples == {"a": 3} and ewma.get("b") is None
    with pytest.raises(ValueError, match="negative"):
        ewma.update("a", -1.0)
    with pytest.raises(ValueError, match="alpha"):
        LatencyEwma(alpha=0.0)


def test_measured_latency_changes_the_route():
    from drift.client.latency import LatencyEwma

    ewma = LatencyEwma()
    table = [srv("a", 0, 8, rtt=None), srv("b", 0, 8, rtt=None)]
    for _ in range(5):
        ewma.update("a", 2.0)
        ewma.update("b", 0.01)
    measured = [ServerInfo(s.peer_id, s.addr, 0, 8, s.throughput, s.cache_tokens_left,
                           ewma.get(s.peer_id)) for s in table]  # fmt: skip
    assert inference_route(measured, 0, 8)[0].peer_id == "b"


def _old_style_split_table(left):
    """Two servers 0:15 / 15:30 whose free KV room is `left` tokens per block of their span."""
    return [srv("a", 0, 15, cache=left), srv("b", 15, 30, cache=left)]


@pytest.mark.parametrize("left", [14 * 2048, 3 * 2048, 2048, 2047, 0])
def test_kv_room_never_splits_a_server_into_hops(left):
    """Held sessions shrink cache_tokens_left; whether or not the new session fits, the chain
    is one hop per server (main split it into [0,1) [1,15) [15,16) [16,30) and shorter)."""
    model = LatencyModel(cache_tokens_needed=2048)
    route = inference_route(_old_style_split_table(left), 0, 30, model)
    assert [(h.peer_id, h.start_block, h.end_block) for h in route] == [("a", 0, 15), ("b", 15, 30)]


def test_kv_room_is_judged_per_block_of_the_span():
    """cache_tokens_left is per block of the server's span: a session over k of its n blocks
    needs tokens x k of the tokens_left x n block-tokens free."""
    model = LatencyModel(cache_tokens_needed=100)
    s = srv("a", 0, 10, cache=100)
    assert model.has_room(s, 10) and model.has_room(s, 3)
    assert not LatencyModel(cache_tokens_needed=101).has_room(s, 10)
    assert LatencyModel(cache_tokens_needed=200).has_room(s, 5)
    assert not LatencyModel(cache_tokens_needed=200).has_room(s, 6)


def _chain_cost(route, table, model):
    by_id = {s.peer_id: s for s in table}
    return sum(model.hop_cost(by_id[h.peer_id], h.end_block - h.start_block) for h in route)


def _brute_force(table, start, end, model, last=None):
    """The least cost of any chain over [start, end) without two consecutive hops on one server."""
    if start == end:
        return 0.0
    best = float("inf")
    for s in table:
        if s.peer_id == last or not s.start_block <= start < s.end_block:
            continue
        for stop in range(start + 1, min(s.end_block, end) + 1):
            rest = _brute_force(table, stop, end, model, s.peer_id)
            best = min(best, model.hop_cost(s, stop - start) + rest)
    return best


def test_route_is_optimal_among_chains_without_repeats():
    rng = random.Random(7)
    for _ in range(60):
        n = 6
        table = [srv("cover", 0, n, tp=rng.choice([5.0, 50.0]), cache=rng.choice([0, 64, 999]))]
        for i in range(rng.randint(1, 3)):
            a = rng.randrange(n)
            b = rng.randint(a + 1, n)
            table.append(
                srv(
                    f"s{i}",
                    a,
                    b,
                    tp=rng.choice([5.0, 50.0, 500.0]),
                    cache=rng.choice([0, 64, 999]),
                    rtt=rng.choice([0.001, 0.05]),
                )
            )
        model = LatencyModel(cache_tokens_needed=rng.choice([0, 100, 500]), cache_penalty_s=1.0)
        route = inference_route(table, 0, n, model)
        assert route[0].start_block == 0 and route[-1].end_block == n
        assert all(x.end_block == y.start_block for x, y in zip(route, route[1:], strict=False))
        assert all(x.peer_id != y.peer_id for x, y in zip(route, route[1:], strict=False))
        assert _chain_cost(route, table, model) == pytest.approx(_brute_force(table, 0, n, model))
