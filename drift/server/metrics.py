"""Server metrics in Prometheus text format: requests by route and status, step latency.

Counters and a latency histogram kept per server instance (no global registry); gauges
(active sessions, cache tokens) are read at render time from what owns them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from drift import metrics as m
from drift.metrics import Histogram

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]],
                 histograms: dict[str, tuple[str, Callable[[], Histogram]]] | None = None,
                 ) -> None:  # fmt: skip
        self.requests: Counter[tuple[str, str]] = Counter()  # (route, status) -> count
        self.step_latency = Histogram(LATENCY_BUCKETS_S)  # seconds per inference step
        self.forward_latency = Histogram(LATENCY_BUCKETS_S)  # seconds per /forward or /backward
        self.gauges = gauges  # name -> (help text, reader)
        self.histograms = histograms or {}  # name -> (help text, reader): owned elsewhere

    def count(self, route: str, status: int | str) -> None:
        self.requests[(route, str(status))] += 1

    def render(self) -> str:
        return m.text([
            *m.requests_counter("drift_requests_total", "Requests served, by route and status.",
                                self.requests),
            *m.histogram("drift_step_latency_seconds", "Inference step latency on this server.",
                         self.step_latency),
            *m.histogram("drift_compute_latency_seconds", "/forward and /backward latency.",
                         self.forward_latency),
            *(line for name, (help_text, read) in self.histograms.items()
              for line in m.histogram(name, help_text, read())),
            *m.gauges(self.gauges),
        ])  # fmt: skip
