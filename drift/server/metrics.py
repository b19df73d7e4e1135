"""Server metrics in Prometheus text format: requests by route and status, step latency.

Counters and a latency histogram kept per server instance (no global registry); gauges
(active sessions, cache tokens) are read at render time from what owns them.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from drift import metrics as m
from drift.metrics import Histogram

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class RateMeter:
    """Per-second rates of cumulative counters over a sliding window, sampled by `rates`."""

    def __init__(self, window_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.samples: deque[tuple[float, dict[str, int]]] = deque()

    def rates(self, **totals: int) -> dict[str, float]:
        """{name + "_per_s": rate} for each counter total given (sample about once a second)."""
        now = self.clock()
        self.samples.append((now, totals))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()  # keep one sample at or past the window as the base
        t0, base = self.samples[0]
        dt = now - t0
        return {f"{k}_per_s": round((v - base.get(k, v)) / dt, 2) if dt > 0 else 0.0
                for k, v in totals.items()}  # fmt: skip


def tokens_of(hidden_states: Any) -> int:
    """Tokens in a [B, T, H] batch: B x T."""
    return int(hidden_states.shape[0]) * int(hidden_states.shape[1])


class ServerMetrics:
    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]],
                 histograms: dict[str, tuple[str, Callable[[], Histogram]]] | None = None,
                 counters: dict[str, tuple[str, Callable[[], float]]] | None = None,
                 ) -> None:  # fmt: skip
        self.requests: Counter[tuple[str, str]] = Counter()  # (route, status) -> count
        self.step_latency = Histogram(LATENCY_BUCKETS_S)  # seconds per inference step
        self.forward_latency = Histogram(LATENCY_BUCKETS_S)  # seconds per /forward or /backward
        self.gauges = gauges  # name -> (help text, reader)
        self.histograms = histograms or {}  # name -> (help text, reader): owned elsewhere
        self.counters = counters or {}  # name -> (help text, reader): owned elsewhere
        self.steps_total = 0  # inference steps run
        self.tokens_total = 0  # tokens (batch x length) through the span
        self.block_tokens_total = 0  # tokens x the blocks each ran through
        self.meter = RateMeter()

    def processed(self, tokens: int, blocks: int, *, step: bool) -> None:
        """Count one request's work: `tokens` = batch x new length through `blocks` blocks;
        `step`: an inference step."""
        self.tokens_total += tokens
        self.block_tokens_total += tokens * blocks
        self.steps_total += int(step)

    def load(self) -> dict[str, float]:
        """steps/s, tokens/s and block-tokens/s over the last few seconds, as a server
        announces them in its record (drift.swarm.record.OPTIONAL_FIELDS); call it about once
        a second."""
        return self.meter.rates(steps=self.steps_total, tokens=self.tokens_total,
                                block_tokens=self.block_tokens_total)  # fmt: skip

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
            *m.counter("drift_steps_total", "Inference steps run.", self.steps_total),
            *m.counter("drift_tokens_total", "Tokens (batch x length) processed.",
                       self.tokens_total),
            *(line for name, (help_text, read) in self.counters.items()
              for line in m.counter(name, help_text, read())),
            *m.gauges(self.gauges),
        ])  # fmt: skip
