"""Choosing servers for a chain of blocks: pure functions over a table of servers.

Inference picks the chain of least expected latency (measured round trips plus per-block
compute from announced throughput, with a penalty for servers short of KV-cache room);
forward/backward spread load by throughput. Knows nothing about HTTP or torch.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from drift.swarm import PeerRecord, format_ranges
from drift.wire.errors import MissingBlocks


@dataclass(frozen=True)
class ServerInfo:
    """What routing needs to know about one serving peer."""

    peer_id: str
    addr: str  # base URL, e.g. "http://127.0.0.1:31337"
    start_block: int
    end_block: int
    throughput: float  # block-tokens per second for one block (higher is faster)
    cache_tokens_left: int
    rtt_s: float | None = None  # measured round trip, None if not measured yet
    adapters: tuple[str, ...] = ()  # LoRA adapters it serves, by name

    @classmethod
    def from_record(cls, record: PeerRecord, rtt_s: float | None = None) -> ServerInfo:
        """A serving record (online, with a span and an address) as a routing entry."""
        assert record.span is not None and record.addrs, "not a serving record"
        return cls(record.peer_id, record.addrs[0].rstrip("/"), *record.span,
                   throughput=float(record.throughput or 1.0),
                   cache_tokens_left=record.cache_tokens_left, rtt_s=rtt_s,
                   adapters=record.adapters)  # fmt: skip


@dataclass(frozen=True)
class Hop:
    """One server's share of a chain: blocks [start_block, end_block) on `peer_id`."""

    peer_id: str
    addr: str
    start_block: int
    end_block: int


def missing_blocks(servers: Iterable[ServerInfo], start_block: int, end_block: int) -> list[int]:
    covered: set[int] = set()
    for s in servers:
        covered.update(range(max(s.start_block, start_block), min(s.end_block, end_block)))
    return [b for b in range(start_block, end_block) if b not in covered]


def _check_covered(servers: list[ServerInfo], start_block: int, end_block: int) -> None:
    if start_block >= end_block:
        raise ValueError(f"empty span [{start_block}, {end_block})")
    missing = missing_blocks(servers, start_block, end_block)
    if missing:
        raise MissingBlocks(
            f"no live server covers blocks {format_ranges(missing)} of [{start_block}, {end_block})",
            missing=missing,
        )


@dataclass(frozen=True)
class LatencyModel:
    rtt_default_s: float = 0.01  # round trip assumed for unmeasured servers
    cache_penalty_s: float = 10.0  # added for a server that lacks the cache room asked for
    cache_tokens_needed: int = 0  # tokens of KV cache per block the session will hold
    extra_cost: dict[str, float] = field(default_factory=dict)  # peer_id -> added seconds

    def hop_cost(self, server: ServerInfo, n_blocks: int) -> float:
        rtt = server.rtt_s if server.rtt_s is not None else self.rtt_default_s
        compute = n_blocks / max(server.throughput, 1e-9)
        penalty = 0.0
        if server.cache_tokens_left < self.cache_tokens_needed * n_blocks:
            penalty = self.cache_penalty_s
        return rtt + compute + penalty + self.extra_cost.get(server.peer_id, 0.0)


def inference_route(
    servers: Iterable[ServerInfo],
    start_block: int,
    end_block: int,
    model: LatencyModel | None = None,
) -> list[Hop]:
    """The chain over [start_block, end_block) with the least expected latency (Dijkstra).

    Raises MissingBlocks naming the blocks that no server covers.
    """
    table = list(servers)
    _check_covered(table, start_block, end_block)
    model = model or LatencyModel()
    best: dict[int, float] = {start_block: 0.0}
    prev: dict[int, tuple[int, ServerInfo]] = {}
    heap: list[tuple[float, int]] = [(0.0, start_block)]
    while heap:
        cost, block = heapq.heappop(heap)
        if block == end_block:
            break
        if cost > best.get(block, float("inf")):
            continue
        for s in table:
            if not s.start_block <= block < s.end_block:
                continue
            for stop in range(block + 1, min(s.end_block, end_block) + 1):
                new_cost = cost + model.hop_cost(s, stop - block)
                if new_cost < best.get(stop, float("inf")) - 1e-12:
                    best[stop] = new_cost
                    prev[stop] = (block, s)
                    heapq.heappush(heap, (new_cost, stop))
    return _unwind(prev, start_block, end_block)


def _unwind(prev: dict[int, tuple[int, ServerInfo]], start: int, end: int) -> list[Hop]:
    hops: list[Hop] = []
    block = end
    while block != start:
        begin, s = prev[block]
        hops.append(Hop(s.peer_id, s.addr, begin, block))
        block = begin
    return hops[::-1]


def spread_route(
    servers: Iterable[ServerInfo],
    start_block: int,
    end_block: int,
    rng: random.Random | Callable[[], float] | None = None,
) -> list[Hop]:
    """A chain for stateless forward/backward: at each gap, a server drawn by throughput.

    Among the servers covering the next block, one is drawn with probability proportional
    to its throughput, and it takes as many blocks as it holds.
    """
    table = list(servers)
    _check_covered(table, start_block, end_block)
    draw = rng.random if isinstance(rng, random.Random) else (rng or random.random)
    hops: list[Hop] = []
    block = start_block
    while block < end_block:
        # prefer servers that go furthest when several are equally fast? no: weight only.
        candidates = [s for s in table if s.start_block <= block < s.end_block]
        weights = [max(s.throughput, 1e-9) for s in candidates]
        pick = draw() * sum(weights)
        chosen = candidates[-1]
        for s, w in zip(candidates, weights, strict=True):
            if pick < w:
                chosen = s
                break
            pick -= w
        stop = min(chosen.end_block, end_block)
        hops.append(Hop(chosen.peer_id, chosen.addr, block, stop))
        block = stop
    return hops
