"""Server metrics in Prometheus text format: requests by route and status, step latency.

Counters and a latency histogram kept per server instance (no global registry); gauges
(active sessions, cache tokens) are read at render time from what owns them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
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
        lines += [f"{name}_sum{suffix} {self.sum:.6f}", f"{name}_count{suffix} {self.count}"]
        return lines


class ServerMetrics:
    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()  # (route, status) -> count
        self.step_latency = Histogram()  # seconds per inference step
        self.forward_latency = Histogram()  # seconds per /forward or /backward
        self.gauges = gauges  # name -> (help text, reader)

    def count(self, route: str, status: int | str) -> None:
        self.requests[(route, str(status))] += 1

    def render(self) -> str:
        lines = [
            "# HELP drift_requests_total Requests served, by route and status.",
            "# TYPE drift_requests_total counter",
        ]
        for (route, status), n in sorted(self.requests.items()):
            lines.append(f'drift_requests_total{{route="{route}",status="{status}"}} {n}')
        lines += [
            "# HELP drift_step_latency_seconds Inference step latency on this server.",
            "# TYPE drift_step_latency_seconds histogram",
            *self.step_latency.render("drift_step_latency_seconds"),
            "# HELP drift_compute_latency_seconds /forward and /backward latency.",
            "# TYPE drift_compute_latency_seconds histogram",
            *self.forward_latency.render("drift_compute_latency_seconds"),
        ]
        for name, (help_text, read) in self.gauges.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {read()}"]
        return "\n".join(lines) + "\n"
