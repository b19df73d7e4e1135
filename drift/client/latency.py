"""Measured latency per peer: an exponentially weighted moving average of round trips.

The swarm view feeds it GET /swarm round trips and the inference session feeds it every
step's time on each span; routing reads it as ServerInfo.rtt_s. Pure, clock-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from drift.wire.progress import ComputeStatus

# A server's unit of compute (a prompt chunk) is sized to take about `unit_s` at its pace
# measured alone; on a shared host one may take a few times that before it counts as stuck.
UNIT_SLACK = 4.0


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
    """How long to wait for a peer's reply: a few times what it should take.

    Per (peer, kind) it keeps an EWMA of the seconds of short calls (a decode step: at most
    `short_tokens` tokens) and of the seconds per token of longer ones (a prefill, a forward).
    A call's wait is `factor` x the expected time of that call and of the calls this client
    already has in flight on that peer (a server computes them first: a decode step sent
    behind eight prompts waits for the eight), within [min_s, max_s]. A call whose cost, or
    that of a call ahead of it, was never measured gets max_s. So a frozen server is left in
    seconds once its pace is known, and a server busy with this client's own work is not.
    Pure, clock-free.
    """

    def __init__(self, *, factor: float, min_s: float, max_s: float, short_tokens: int = 8,
                 alpha: float = 0.3) -> None:  # fmt: skip
        if not (factor >= 1 and 0 < min_s <= max_s):
            raise ValueError(f"need factor >= 1 and 0 < min_s <= max_s, got {factor}, "
                             f"{min_s}, {max_s}")  # fmt: skip
        self.factor, self.min_s, self.max_s = factor, min_s, max_s
        self.short_tokens = short_tokens
        self._short = LatencyEwma(alpha)  # "peer:kind" -> seconds of a short call
        self._per_token = LatencyEwma(alpha)  # "peer:kind" -> seconds per token of a long call
        self._in_flight: dict[str, dict[int, tuple[str, int]]] = {}  # peer -> call -> kind, tokens
        self._calls = itertools.count()

    def observe(self, peer: str, kind: str, tokens: int, seconds: float) -> None:
        key = f"{peer}:{kind}"
        if tokens <= self.short_tokens:
            self._short.update(key, seconds)
        else:
            self._per_token.update(key, seconds / tokens)

    def expected(self, peer: str, kind: str, tokens: int) -> float | None:
        """Seconds a call of `tokens` tokens should take on its own, or None if unknown."""
        key = f"{peer}:{kind}"
        short, per_token = self._short.get(key), self._per_token.get(key)
        if tokens <= self.short_tokens:
            return short if short is not None else (
                None if per_token is None else per_token * self.short_tokens)  # fmt: skip
        if per_token is None:
            return None  # a long call's cost is not known from short ones
        return max(short or 0.0, per_token * tokens)

    def timeout(self, peer: str, kind: str, tokens: int) -> float:
        """The wait for a call sent now: its own expected time and that of the calls in
        flight on `peer`, times `factor`, within [min_s, max_s]."""
        total = 0.0
        for k, t in [(kind, tokens), *self._in_flight.get(peer, {}).values()]:
            expected = self.expected(peer, k, t)
            if expected is None:
                return self.max_s
            total += expected
        return min(self.max_s, max(self.min_s, self.factor * total))

    @contextmanager
    def waiting(self, peer: str, kind: str, tokens: int) -> Iterator[float]:
        """Around one call: yields its timeout, and counts the call as in flight on `peer`
        (for later calls' timeouts) until the block ends."""
        timeout_s = self.timeout(peer, kind, tokens)
        call = next(self._calls)
        calls = self._in_flight.setdefault(peer, {})
        calls[call] = (kind, tokens)
        try:
            yield timeout_s
        finally:
            del calls[call]
            if not calls:
                self._in_flight.pop(peer, None)

    def more_wait(self, status: ComputeStatus | None, waited_s: float, window_s: float) -> float:
        """Seconds more to wait for a call past its timeout, from the server's GET /compute
        (None: it did not answer): another `window_s` while the server holds the call and
        the unit of work it runs now has run no longer than its units take (a server busy
        with other clients' work), never past max_s in all; else 0 (frozen, or the call is
        not there)."""
        if status is None or not status.pending:
            return 0.0
        if status.running_s > max(self.min_s, UNIT_SLACK * (status.unit_s or 0.0)):
            return 0.0
        return max(0.0, min(window_s, self.max_s - waited_s))

    def in_flight(self, peer: str) -> int:
        """Calls this client has in flight on `peer`."""
        return len(self._in_flight.get(peer, ()))
