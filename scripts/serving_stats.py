"""The pure parts of scripts/bench_serving.py: load specs, arrival schedules, seeded prompt
and output lengths, percentiles and the summary of one run. No I/O, no drift imports, so the
tests can check them exactly.

A load is `KIND:VALUE`:
- `concurrency:C`: C workers, each sending its next request as soon as its last one ends;
- `rate:R`: Poisson arrivals at R requests/s (`rate:inf`: all at once);
- `interval:S`: one request every S seconds (a fixed stagger).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

KINDS = ("concurrency", "rate", "interval")
WORDS = (
    "the river city old bridge market light winter story garden music stone letter road "
    "window morning harbor forest summer village station painter teacher mountain island "
    "lamp clock bread paper voice field cloud train"
).split()


@dataclass(frozen=True)
class Load:
    kind: str  # one of KINDS
    value: float

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.value:g}"


def parse_load(text: str) -> Load:
    """`concurrency:8`, `rate:2.5`, `rate:inf`, `interval:0.5`; ValueError names the problem."""
    kind, _, value = text.partition(":")
    if kind not in KINDS or not value:
        raise ValueError(f"load {text!r}: write KIND:VALUE with KIND one of {', '.join(KINDS)}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"load {text!r}: {value!r} is not a number") from None
    if kind == "concurrency" and (number < 1 or number != int(number)):
        raise ValueError(f"load {text!r}: concurrency must be a whole number >= 1")
    if kind == "rate" and not number > 0:
        raise ValueError(f"load {text!r}: rate must be > 0 (requests/s; inf: all at once)")
    if kind == "interval" and (number < 0 or math.isinf(number)):
        raise ValueError(f"load {text!r}: interval must be >= 0 seconds")
    return Load(kind, number)


def arrival_offsets(load: Load, n: int, seed: int) -> list[float] | None:
    """Send time of each of `n` requests, seconds after the start; None for `concurrency`
    (there a request goes when a worker is free, not at a planned time). Seeded: the
    same (load, n, seed) always gives the same schedule; the first request goes at 0."""
    if load.kind == "concurrency":
        return None
    if load.kind == "interval":
        return [i * load.value for i in range(n)]
    if math.isinf(load.value):
        return [0.0] * n
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(load.value)
        offsets.append(t)
    return offsets


def lengths(n: int, mean: int, spread: float, seed: int) -> list[int]:
    """`n` lengths drawn uniformly from [mean*(1-spread), mean*(1+spread)], rounded, >= 1;
    spread 0 gives `mean` every time."""
    if not 0 <= spread <= 1:
        raise ValueError(f"spread must be within [0, 1], not {spread}")
    rng = random.Random(seed)
    low, high = mean * (1 - spread), mean * (1 + spread)
    return [max(1, round(rng.uniform(low, high))) for _ in range(n)]


def prompt_text(index: int, words: int, seed: int) -> str:
    """Request `index`'s prompt: `words` seeded words (roughly as many tokens), the same for
    the same (index, words, seed) in every run and against every server."""
    rng = random.Random(f"{seed}:{index}")
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Continue this text: {body}"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks (as
    numpy's default); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Outcome:
    """One request as the client saw it; times in seconds from the run's start."""

    index: int
    sent: float
    first: float | None = None  # first non-empty text chunk
    done: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # every non-empty text chunk
    text: str = ""
    tokens: int = 0  # completion tokens: the usage the server reports, else text chunks
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (end - first token) / (tokens - 1)."""
        if self.first is None or self.done is None or self.tokens < 2:
            return None
        return (self.done - self.first) / (self.tokens - 1)


QUANTILES = (50, 90, 99)


def summarize(outcomes: list[Outcome], wall_s: float) -> dict:
    """Counts, throughput over the run's wall time and latency percentiles (ms) of the
    requests that completed; every sent request is either completed or an error."""
    ok = [o for o in outcomes if o.error is None]
    ttfts = [o.ttft * 1e3 for o in ok if o.ttft is not None]
    tpots = [o.tpot * 1e3 for o in ok if o.tpot is not None]
    e2es = [(o.done - o.sent) * 1e3 for o in ok if o.done is not None]
    tokens = sum(o.tokens for o in ok)
    out = {
        "requests": len(outcomes),
        "completed": len(ok),
        "errors": len(outcomes) - len(ok),
        "output_tokens": tokens,
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else math.nan,
        "output_tokens_per_s": tokens / wall_s if wall_s > 0 else math.nan,
        "error_messages": sorted({o.error for o in outcomes if o.error is not None}),
    }
    for name, values in (("ttft_ms", ttfts), ("tpot_ms", tpots), ("e2e_ms", e2es)):
        for q in QUANTILES:
            out[f"{name}_p{q}"] = percentile(values, q)
    return out


def solo_bound(outcomes: list[Outcome], solo: list[Outcome]) -> float:
    """Output tokens/s the load could reach at most had every request taken only its solo
    time (its latency in `solo`, the first load's run of the same request) from when it was
    sent: the run's tokens over max(sent + solo latency). Arrivals spread over time cap a
    load's throughput however fast the server batches: 8 requests one every 0.5 s end no
    sooner than 3.5 s plus the last one's solo latency. NaN without a completed pair."""
    ends, tokens = [], 0
    for o, b in zip(outcomes, solo, strict=True):
        if o.error is None and b.error is None and b.done is not None:
            ends.append(o.sent + (b.done - b.sent))
            tokens += o.tokens
    start = min((o.sent for o in outcomes), default=0.0)
    return tokens / (max(ends) - start) if ends and max(ends) > start else math.nan
