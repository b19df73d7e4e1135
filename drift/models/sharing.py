"""Which blocks reuse the keys/values of earlier blocks (Gemma 4's `num_kv_shared_layers`).

The last blocks of such a model (consumers) compute no keys/values of their own: each reads
those of the last earlier block of its attention type (its donor). `KVSharing` answers what
a span [start, end) must receive (donors before it that its consumers read) and what it can
give (donors in it whose consumers lie after it). Pure functions of the config; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drift.wire.errors import BadRequest


@dataclass(frozen=True)
class KVSharing:
    """Donor and consumer blocks of a model; empty for models that share no keys/values."""

    layer_types: tuple[str, ...] = ()  # attention type of every block
    donors: tuple[tuple[str, int], ...] = ()  # (attention type, donor block) with consumers
    consumers: frozenset[int] = frozenset()  # blocks that read a donor's keys/values

    @classmethod
    def from_config(cls, config: Any) -> KVSharing:
        modes = getattr(config, "kv_sharing_modes", None)
        if not modes or "reuse" not in modes:
            return cls()
        types = tuple(str(t) for t in config.layer_types)
        consumers = frozenset(i for i, mode in enumerate(modes) if mode == "reuse")
        stores = {types[i]: i for i, mode in enumerate(modes) if mode == "store"}
        needed = {types[i] for i in consumers}
        if not needed <= set(stores):
            raise BadRequest(f"blocks {sorted(consumers)} reuse keys/values no block computes")
        donors = tuple(sorted((t, stores[t]) for t in needed))
        return cls(types, donors, consumers)

    def donor_of(self, block: int) -> int | None:
        """The donor whose keys/values consumer `block` reads; None for other blocks."""
        if block not in self.consumers:
            return None
        return dict(self.donors)[self.layer_types[block]]

    def cache_slot(self, block: int) -> int:
        """Where a session keeps the keys/values `block` attends to: its own, or its donor's."""
        donor = self.donor_of(block)
        return block if donor is None else donor

    def consumed(self, start: int, end: int) -> tuple[int, ...]:
        """Donors before `start` whose keys/values blocks of [start, end) read."""
        wanted = {self.donor_of(b) for b in range(start, end)}
        return tuple(sorted(d for d in wanted if d is not None and d < start))

    def donated(self, start: int, end: int, stop: int) -> tuple[int, ...]:
        """Donors in [start, end) whose keys/values blocks of [end, stop) read."""
        readers = {self.donor_of(b) for b in range(end, stop)}
        return tuple(sorted(d for d in readers if d is not None and start <= d < end))
