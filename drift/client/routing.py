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
    compute: str | None = None  # the cores or GPU it computes on, by name (its record's)

    @classmethod
    def from_record(cls, record: PeerRecord, rtt_s: float | None = None) -> ServerInfo:
        """A serving record (online, with a span and an address) as a routing entry."""
        assert record.span is not None and record.addrs, "not a serving record"
        return cls(record.peer_id, record.addrs[0].rstrip("/"), *record.span,
                   throughput=float(record.throughput or 1.0),
                   cache_tokens_left=record.cache_tokens_left, rtt_s=rtt_s,
                   adapters=record.adapters, compute=record.compute)  # fmt: skip


@dataclass(frozen=True)
class Hop:
    """One server's share of a chain: blocks [start_block, end_block) on `peer_id`."""

    peer_id: str
    addr: str
    start_block: int
    end_block: int
    # the cores or GPU its server computes on, by name (drift.server.compute_name); hops
    # that share one take a pipeline's chunks one after the other (Chain.pipeline)
    compute: str | None = field(default=None, compare=False)


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

    def has_room(self, server: ServerInfo, n_blocks: int) -> bool:
        """Whether `server` can hold this session's KV for `n_blocks` of its blocks.

        `cache_tokens_left` is per block of the server's whole span (its free block-tokens
        divided by its span), and a session over k of its n blocks reserves tokens x k
        block-tokens: so it fits when tokens x k <= cache_tokens_left x n.
        """
        span = max(server.end_block - server.start_block, 1)
        return self.cache_tokens_needed * n_blocks <= server.cache_tokens_left * span

    def hop_cost(self, server: ServerInfo, n_blocks: int) -> float:
        rtt = server.rtt_s if server.rtt_s is not None else self.rtt_default_s
        compute = n_blocks / max(server.throughput, 1e-9)
        penalty = 0.0 if self.has_room(server, n_blocks) else self.cache_penalty_s
        return rtt + compute + penalty + self.extra_cost.get(server.peer_id, 0.0)


# A label of Dijkstra's search: the cheapest known chain reaching a block whose last hop ran
# on `last`; `back` is (the block that hop began at, the last server of the chain there).
_Label = tuple[float, str | None, tuple[int, str | None] | None]


def inference_route(
    servers: Iterable[ServerInfo],
    start_block: int,
    end_block: int,
    model: LatencyModel | None = None,
) -> list[Hop]:
    """The chain over [start_block, end_block) with the least expected latency (Dijkstra).

    Two consecutive hops never run on the same server: a server's blocks are one hop (a
    split would cost a round trip, and would dodge the KV-room check by asking room per
    piece). Each block keeps its two best labels with different last servers, which is
    enough for that rule to stay exact. Raises MissingBlocks naming the blocks that no
    server covers.
    """
    table = {s.peer_id: s for s in servers}
    _check_covered(list(table.values()), start_block, end_block)
    model = model or LatencyModel()
    labels: dict[int, list[_Label]] = {start_block: [(0.0, None, None)]}
    heap: list[tuple[float, int, str]] = [(0.0, start_block, "")]
    while heap:
        cost, block, last_key = heapq.heappop(heap)
        last = last_key or None
        if block == end_block:
            return _unwind(labels, table, start_block, end_block, last)
        if not any(lab[0] == cost and lab[1] == last for lab in labels.get(block, [])):
            continue  # stale: a cheaper label replaced this one
        for s in table.values():
            if s.peer_id == last or not s.start_block <= block < s.end_block:
                continue
            for stop in range(block + 1, min(s.end_block, end_block) + 1):
                new_cost = cost + model.hop_cost(s, stop - block)
                if _offer(labels.setdefault(stop, []), (new_cost, s.peer_id, (block, last))):
                    heapq.heappush(heap, (new_cost, stop, s.peer_id))
    raise AssertionError("covered blocks always have a chain")  # pragma: no cover


def _offer(kept: list[_Label], label: _Label) -> bool:
    """Keep `label` among a block's two best labels with distinct last servers; True if kept."""
    for i, old in enumerate(kept):
        if old[1] == label[1]:
            if label[0] < old[0] - 1e-12:
                kept[i] = label
                kept.sort(key=lambda x: x[0])
                return True
            return False
    if len(kept) < 2:
        kept.append(label)
    elif label[0] < kept[-1][0] - 1e-12:
        kept[-1] = label
    else:
        return False
    kept.sort(key=lambda x: x[0])
    return True


def _unwind(labels: dict[int, list[_Label]], table: dict[str, ServerInfo], start: int,
            end: int, last: str | None) -> list[Hop]:  # fmt: skip
    hops: list[Hop] = []
    block = end
    while block != start:
        label = next(lab for lab in labels[block] if lab[1] == last)
        assert label[1] is not None and label[2] is not None
        s = table[label[1]]
        begin, last = label[2]
        hops.append(Hop(s.peer_id, s.addr, begin, block, s.compute))
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
        hops.append(Hop(chosen.peer_id, chosen.addr, block, stop, chosen.compute))
        block = stop
    return hops
