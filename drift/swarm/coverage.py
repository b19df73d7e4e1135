"""Which blocks of a model the swarm serves: peers and summed throughput per block.

Pure functions over lists of records; only `online` server records count. The JSON shape
is the one of `GET /swarm/coverage` in docs/internals.md.
"""

from __future__ import annotations

from typing import Any

from drift.swarm.record import PeerRecord
from drift.wire.errors import NotFound


def serving_records(records: list[PeerRecord]) -> list[PeerRecord]:
    """Online records that serve a span of a named model."""
    return [
        r
        for r in records
        if r.state == "online"
        and r.span is not None
        and r.model_fingerprint is not None
        and r.num_blocks is not None
    ]


def models_in(records: list[PeerRecord]) -> list[dict[str, Any]]:
    """The distinct models served, by fingerprint: [{model, model_fingerprint, num_blocks}]."""
    seen: dict[str, dict[str, Any]] = {}
    for r in serving_records(records):
        assert r.model_fingerprint is not None
        seen.setdefault(
            r.model_fingerprint,
            {
                "model": r.model,
                "model_fingerprint": r.model_fingerprint,
                "num_blocks": r.num_blocks,
            },
        )
    return [seen[k] for k in sorted(seen)]


def records_for_model(records: list[PeerRecord], model: str) -> list[PeerRecord]:
    """Serving records whose fingerprint or name is `model`."""
    return [r for r in serving_records(records) if model in (r.model_fingerprint, r.model)]


def block_throughputs(records: list[PeerRecord], num_blocks: int) -> list[float]:
    """Summed throughput of online servers per block (0.0 where nobody serves it)."""
    out = [0.0] * num_blocks
    for r in records:
        if r.state != "online" or r.span is None:
            continue
        for b in range(max(0, r.span[0]), min(num_blocks, r.span[1])):
            out[b] += float(r.throughput)
    return out


def block_peers(records: list[PeerRecord], num_blocks: int) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in range(num_blocks)]
    for r in records:
        if r.state != "online" or r.span is None:
            continue
        for b in range(max(0, r.span[0]), min(num_blocks, r.span[1])):
            out[b].append(r.peer_id)
    return out


def missing_blocks(records: list[PeerRecord], num_blocks: int) -> list[int]:
    return [i for i, peers in enumerate(block_peers(records, num_blocks)) if not peers]


def coverage(records: list[PeerRecord], model: str | None = None) -> dict[str, Any]:
    """Coverage of one model (by fingerprint or name; the only one if `model` is None)."""
    models = models_in(records)
    if model is None:
        if len(models) != 1:
            if models:
                names = [m["model_fingerprint"] for m in models]
                raise NotFound(
                    f"the swarm serves {len(models)} models; pick one with ?model= (one of {names})"
                )
            return {
                "models": [],
                "model": None,
                "model_fingerprint": None,
                "num_blocks": None,
                "blocks": [],
                "missing": [],
            }
        model = models[0]["model_fingerprint"]
    matching = [m for m in models if model in (m["model_fingerprint"], m["model"])]
    if not matching:
        known = [f"{m['model']} ({m['model_fingerprint']})" for m in models] or ["none"]
        raise NotFound(f"no server in the swarm serves model {model!r}; served: {known}")
    if len({m["model_fingerprint"] for m in matching}) > 1:
        raise NotFound(f"model name {model!r} is ambiguous; ask by fingerprint")
    info = matching[0]
    num_blocks = int(info["num_blocks"])
    chosen = [
        r for r in serving_records(records) if r.model_fingerprint == info["model_fingerprint"]
    ]
    peers = block_peers(chosen, num_blocks)
    through = block_throughputs(chosen, num_blocks)
    return {
        "models": models,
        "model": info["model"],
        "model_fingerprint": info["model_fingerprint"],
        "num_blocks": num_blocks,
        "blocks": [
            {"index": i, "peers": peers[i], "throughput": through[i]} for i in range(num_blocks)
        ],
        "missing": [i for i in range(num_blocks) if not peers[i]],
    }
