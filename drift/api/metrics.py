"""The API process's metrics in Prometheus text format (served at GET /metrics).

Counters: requests by route and status, prompt and completion tokens; histograms: time to
first token, decode tokens per second of each choice, request duration; gauges (queue
depth, generating requests) are read at render time from the service. One instance per
app, no global registry; names follow Prometheus conventions (`_total`, `_seconds`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)


class Histogram:
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

    def render(self, name: str) -> list[str]:
        lines = [
            f'{name}_bucket{{le="{b}"}} {n}' for b, n in zip(self.buckets, self.counts, strict=True)
        ]
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        return [*lines, f"{name}_sum {self.sum:.6f}", f"{name}_count {self.count}"]


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
        lines = [
            "# HELP drift_api_requests_total HTTP requests answered, by route and status.",
            "# TYPE drift_api_requests_total counter",
        ]
        for (route, status), n in sorted(self.requests.items()):
            lines.append(f'drift_api_requests_total{{route="{route}",status="{status}"}} {n}')
        counters = [("drift_api_prompt_tokens_total", "Prompt tokens read.", self.prompt_tokens),
                    ("drift_api_completion_tokens_total", "Tokens generated.",
                     self.completion_tokens)]  # fmt: skip
        for name, help_text, value in counters:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
        histograms = [
            ("drift_api_time_to_first_token_seconds", "From admission to a choice's first token.",
             self.ttft),
            ("drift_api_decode_tokens_per_second", "Tokens per second of each choice after its "
             "first token.", self.decode_rate),
            ("drift_api_request_duration_seconds", "Wall time of each /v1 request.", self.duration),
        ]  # fmt: skip
        for name, help_text, hist in histograms:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram", *hist.render(name)]
        for name, (help_text, read) in self.gauges.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {read()}"]
        return "\n".join(lines) + "\n"
