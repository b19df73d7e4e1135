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
