"""Measured latency per peer: an exponentially weighted moving average of round trips.

The swarm view feeds it GET /swarm round trips and the inference session feeds it every
step's time on each span; routing reads it as ServerInfo.rtt_s. Pure, clock-free.
"""

from __future__ import annotations


class LatencyEwma:
    """peer_id -> EWMA of observed seconds; the first sample is taken as is."""

    def __init__(self, alpha: float = 0.3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.values: dict[str, float] = {}
        self.samples: dict[str, int] = {}

    def update(self, peer_id: str, seconds: float) -> float:
        """Fold one observation in; returns the new average."""
        if seconds < 0:
            raise ValueError(f"a round trip cannot be negative ({seconds} s)")
        old = self.values.get(peer_id)
        new = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        self.values[peer_id] = new
        self.samples[peer_id] = self.samples.get(peer_id, 0) + 1
        return new

    def get(self, peer_id: str) -> float | None:
        return self.values.get(peer_id)


class StepTimeouts:
    """How long to wait for a peer's reply: a few times what its replies have taken so far.

    Per (peer, kind) it keeps an EWMA of the seconds of short calls (a decode step: at most
    `short_tokens` tokens) and of the seconds per token of longer ones (a prefill, a forward);
    the timeout for T tokens is `factor` x the expected time, within [min_s, max_s]. A peer
    never measured gets max_s. So a frozen server is left in seconds once its pace is known.
    Pure, clock-free.
    """

    def __init__(self, *, factor: float, min_s: float, max_s: float, short_tokens: int = 8,
                 alpha: float = 0.3) -> None:  # fmt: skip
        if not (factor >= 1 and 0 < min_s <= max_s):
            raise ValueError(f"need factor >= 1 and 0 < min_s <= max_s, got {factor}, "
                             f"{min_s}, {max_s}")  # fmt: skip
        self.factor, self.min_s, self.max_s = factor, min_s, max_s
        self.short_tokens = short_tokens
        self._short = LatencyEwma(alpha)  # key -> seconds of a short call
        self._per_token = LatencyEwma(alpha)  # key -> seconds per token of a long call

    def observe(self, key: str, tokens: int, seconds: float) -> None:
        if tokens <= self.short_tokens:
            self._short.update(key, seconds)
        else:
            self._per_token.update(key, seconds / tokens)

    def expected(self, key: str, tokens: int) -> float | None:
        """Seconds a call of `tokens` tokens should take, or None if nothing is known."""
        short, per_token = self._short.get(key), self._per_token.get(key)
        if tokens <= self.short_tokens:
            return short if short is not None else (
                None if per_token is None else per_token * self.short_tokens)  # fmt: skip
        if per_token is None:
            return None  # a long call's cost is not known from short ones
        return max(short or 0.0, per_token * tokens)

    def timeout(self, key: str, tokens: int) -> float:
        expected = self.expected(key, tokens)
        if expected is None:
            return self.max_s
        return min(self.max_s, max(self.min_s, self.factor * expected))
