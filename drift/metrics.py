"""Prometheus text-format pieces shared by every process that serves /metrics.

A cumulative `Histogram` and `family()` (the HELP/TYPE header plus sample lines). No
registry and no global state: each server or API instance owns its counters and renders
them itself. No imports of DRIFT or third parties.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

Gauges = Mapping[str, tuple[str, Callable[[], float]]]  # name -> (help text, reader)


class Histogram:
    """Observations counted into cumulative buckets (Prometheus `le` semantics)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)  # cumulative: observations <= bound
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        lines = [
            f'{name}_bucket{{{labels}{sep}le="{bound}"}} {n}'
            for bound, n in zip(self.buckets, self.counts, strict=True)
        ]
        lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        return [*lines, f"{name}_sum{suffix} {self.sum:.6f}", f"{name}_count{suffix} {self.count}"]


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    """One metric family: `# HELP`, `# TYPE` (counter | gauge | histogram), its sample lines."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def counter(name: str, help_text: str, value: float) -> list[str]:
    return family(name, "counter", help_text, [f"{name} {value}"])


def requests_counter(name: str, help_text: str, counts: Mapping[tuple[str, Any], int]) -> list[str]:
    """A counter labelled by route and status."""
    samples = [f'{name}{{route="{route}",status="{status}"}} {n}'
               for (route, status), n in sorted(counts.items())]  # fmt: skip
    return family(name, "counter", help_text, samples)


def histogram(name: str, help_text: str, hist: Histogram) -> list[str]:
    return family(name, "histogram", help_text, hist.render(name))


def gauges(readers: Gauges) -> list[str]:
    """Gauges read at render time from what owns them."""
    return [line for name, (help_text, read) in readers.items()
            for line in family(name, "gauge", help_text, [f"{name} {read()}"])]  # fmt: skip


def text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"
