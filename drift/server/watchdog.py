"""The compute watchdog: whether the compute thread still advances.

Each check reads how long the unit of work the thread runs now has been running
(drift.server.compute_thread); one running past `bound_s` means the thread is wedged or
starved: the server is `degraded` until that unit ends. A long queue of units that each end
in time is a busy server, not a degraded one. Knows nothing about records.
"""

from __future__ import annotations

import logging
import time

from drift.server.compute_thread import ComputeThread

log = logging.getLogger(__name__)


class ComputeWatchdog:
    def __init__(self, thread: ComputeThread, bound_s: float) -> None:
        self.thread = thread
        self.bound_s = bound_s  # seconds one unit may run before the server is degraded
        self.degraded = False

    def check(self, now: float | None = None) -> float:
        """Seconds the running unit has run, once past the bound; else 0."""
        stalled = self.thread.running_s(time.monotonic() if now is None else now)
        if stalled <= self.bound_s:
            if self.degraded:
                log.warning("compute advances again: no longer degraded")
                self.degraded = False
            return 0.0
        if not self.degraded:
            log.error("one unit of compute has run for %.1f s (bound %.0f s): announcing this "
                      "server degraded", stalled, self.bound_s)  # fmt: skip
            self.degraded = True
        return round(stalled, 1)
