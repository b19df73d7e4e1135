"""The compute watchdog: whether the compute thread still advances while work is queued.

Each check, a no-op probe is queued behind whatever the thread runs; a probe still waiting
after `bound_s` means nothing queued there has advanced for that long (a wedged or starved
thread): the server is `degraded` until a probe runs again. Knows nothing about records.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future

log = logging.getLogger(__name__)


class ComputeWatchdog:
    def __init__(self, executor: Executor, bound_s: float) -> None:
        self.executor = executor
        self.bound_s = bound_s  # seconds a queued probe may wait before the server is degraded
        self._probe: Future[None] | None = None
        self._sent = 0.0  # time.monotonic() the waiting probe was queued
        self.degraded = False

    def check(self, now: float | None = None) -> float:
        """Seconds the compute has not advanced with work queued, once past the bound; else 0."""
        now = time.monotonic() if now is None else now
        if self._probe is None or self._probe.done():
            if self.degraded:
                log.warning("compute advances again: no longer degraded")
                self.degraded = False
            try:
                self._probe, self._sent = self.executor.submit(_probe), now
            except RuntimeError:  # the executor is shut down (a move, the exit)
                self._probe = None
            return 0.0
        stalled = now - self._sent
        if stalled <= self.bound_s:
            return 0.0
        if not self.degraded:
            log.error("compute has not advanced for %.1f s with work queued (bound %.0f s): "
                      "announcing this server degraded", stalled, self.bound_s)  # fmt: skip
            self.degraded = True
        return round(stalled, 1)


def _probe() -> None:
    """Runs on the compute thread: that it ran is the news."""
