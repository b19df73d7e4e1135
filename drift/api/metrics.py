"""The API process's metrics in Prometheus text format (served at GET /metrics).

Counters: requests by route and status, prompt and completion tokens; histograms: time to
first token, decode tokens per second of each choice, request duration; gauges (queue
depth, generating requests) are read at render time from the service. One instance per
app, no global registry; names follow Prometheus conventions (`_total`, `_seconds`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from drift import metrics as m
from drift.metrics import Histogram

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)


class ApiMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (route, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.decode_rate = Histogram(RATE_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS_S)
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}  # name -> (help, reader)

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        self.duration.observe(seconds)

    def decoded(self, tokens: int, decode_s: float) -> None:
        """A choice ran to its end: `tokens` in `decode_s` seconds after its first token."""
        if tokens > 1 and decode_s > 0:
            self.decode_rate.observe((tokens - 1) / decode_s)

    def render(self) -> str:
        return m.text([
            *m.requests_counter("drift_api_requests_total",
                                "HTTP requests answered, by route and status.", self.requests),
            *m.counter("drift_api_prompt_tokens_total", "Prompt tokens read.", self.prompt_tokens),
            *m.counter("drift_api_completion_tokens_total", "Tokens generated.",
                       self.completion_tokens),
            *m.histogram("drift_api_time_to_first_token_seconds",
                         "From admission to a choice's first token.", self.ttft),
            *m.histogram("drift_api_decode_tokens_per_second",
                         "Tokens per second of each choice after its first token.",
                         self.decode_rate),
            *m.histogram("drift_api_request_duration_seconds", "Wall time of each /v1 request.",
                         self.duration),
            *m.gauges(self.gauges),
        ])  # fmt: skip
