"""Which blocks of a model the swarm serves: peers and summed throughput per block.

Pure functions over lists of records; only `online` server records count. `coverage`
returns the typed `Coverage` document whose `to_wire()` is the JSON of
`GET /swarm/coverage` (docs/internals.md); nodes, `drift status` and `drift up` share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drift.swarm.names import join_name, names_match
from drift.swarm.record import PeerRecord
from drift.wire.errors import NotFound


@dataclass(frozen=True)
class ModelInfo:
    """One model the swarm serves, by fingerprint."""

    model: str | None  # display name
    model_fingerprint: str
    num_blocks: int

    def to_wire(self) -> dict[str, Any]:
        return {"model": self.model, "model_fingerprint": self.model_fingerprint,
                "num_blocks": self.num_blocks}  # fmt: skip


@dataclass(frozen=True)
class BlockCoverage:
    index: int
    peers: tuple[str, ...]  # online peers serving this block
    throughput: float  # their summed block-tokens/s

    def to_wire(self) -> dict[str, Any]:
        return {"index": self.index, "peers": list(self.peers), "throughput": self.throughput}


@dataclass(frozen=True)
class Coverage:
    """Coverage of one model (or of none: `model` None when the swarm serves nothing)."""

    models: tuple[ModelInfo, ...]  # every model served
    model: str | None
    model_fingerprint: str | None
    num_blocks: int | None
    blocks: tuple[BlockCoverage, ...]
    missing: tuple[int, ...]  # blocks no online server covers

    def to_wire(self) -> dict[str, Any]:
        return {
            "models": [m.to_wire() for m in self.models],
            "model": self.model,
            "join_model": join_name(self.model),  # what `drift up` takes on another machine
            "model_fingerprint": self.model_fingerprint,
            "num_blocks": self.num_blocks,
            "blocks": [b.to_wire() for b in self.blocks],
            "missing": list(self.missing),
        }


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


def models_in(records: list[PeerRecord]) -> list[ModelInfo]:
    """The distinct models served, sorted by fingerprint."""
    seen: dict[str, ModelInfo] = {}
    for r in serving_records(records):
        assert r.model_fingerprint is not None and r.num_blocks is not None
        seen.setdefault(r.model_fingerprint, ModelInfo(r.model, r.model_fingerprint, r.num_blocks))
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


def coverage(records: list[PeerRecord], model: str | None = None) -> Coverage:
    """Coverage of one model (by fingerprint, or a name as a user typed it to start a server:
    alias, directory, GGUF file, Hub id; the only one if `model` is None)."""
    models = models_in(records)
    if model is None:
        if len(models) != 1:
            if models:
                names = [m.model_fingerprint for m in models]
                raise NotFound(
                    f"the swarm serves {len(models)} models; pick one with ?model= (one of {names})"
                )
            return Coverage((), None, None, None, (), ())
        model = models[0].model_fingerprint
    matching = [m for m in models if model == m.model_fingerprint]
    matching = matching or [m for m in models if names_match(model, m.model)]
    if not matching:
        known = [f"{m.model} ({m.model_fingerprint})" for m in models] or ["none"]
        raise NotFound(f"no server in the swarm serves model {model!r}; served: {known}")
    if len({m.model_fingerprint for m in matching}) > 1:
        raise NotFound(f"model name {model!r} is ambiguous; ask by fingerprint")
    info = matching[0]
    chosen = [r for r in serving_records(records) if r.model_fingerprint == info.model_fingerprint]
    peers = block_peers(chosen, info.num_blocks)
    through = block_throughputs(chosen, info.num_blocks)
    blocks = tuple(BlockCoverage(i, tuple(peers[i]), through[i]) for i in range(info.num_blocks))
    missing = tuple(i for i in range(info.num_blocks) if not peers[i])
    return Coverage(tuple(models), info.model, info.model_fingerprint, info.num_blocks, blocks,
                    missing)  # fmt: skip


def all_coverages(records: list[PeerRecord], model: str | None = None) -> list[Coverage]:
    """Coverage of `model`, or of every model served (none: an empty list)."""
    if model is not None:
        return [coverage(records, model)]
    return [coverage(records, m.model_fingerprint) for m in models_in(records)]
