"""Bans for failing peers, with exponential backoff; the clock is injected.

A peer that fails is skipped by routing until its ban expires; each further failure
doubles the ban up to a limit, and a success forgets its history. A peer that refused the
connection (nothing listens there) is told apart from one that was slow or busy: routing
waits for the bans of the latter when only they cover some blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class BanList:
    def __init__(
        self, base_s: float, max_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}
        self._unreachable: set[str] = set()  # peers whose last failure was a refused connection

    def ban(self, peer_id: str, *, unreachable: bool = False) -> float:
        """Record a failure (`unreachable`: the connection was refused); returns the ban's
        length in seconds."""
        n = self._failures.get(peer_id, 0) + 1
        self._failures[peer_id] = n
        length = min(self.base_s * 2 ** (n - 1), self.max_s)
        self._until[peer_id] = self._clock() + length
        if unreachable:
            self._unreachable.add(peer_id)
        else:
            self._unreachable.discard(peer_id)
        return length

    def success(self, peer_id: str) -> None:
        self._failures.pop(peer_id, None)
        self._until.pop(peer_id, None)
        self._unreachable.discard(peer_id)

    def worth_waiting_for(self, peer_id: str) -> bool:
        """Failed once (a blip), or last failed by being slow or busy, not by refusing the
        connection: still there, so its ban is worth waiting out."""
        return self.failures(peer_id) <= 1 or peer_id not in self._unreachable

    def is_banned(self, peer_id: str) -> bool:
        until = self._until.get(peer_id)
        return until is not None and self._clock() < until

    def banned(self) -> set[str]:
        now = self._clock()
        return {p for p, until in self._until.items() if now < until}

    def failures(self, peer_id: str) -> int:
        """Failures in a row (0 after a success)."""
        return self._failures.get(peer_id, 0)

    def remaining(self, peer_id: str) -> float:
        """Seconds until `peer_id`'s ban ends (0.0 when it is not banned)."""
        until = self._until.get(peer_id)
        return 0.0 if until is None else max(0.0, until - self._clock())
