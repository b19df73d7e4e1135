"""The compute thread: one worker that runs units of torch work in order, and knows how long
the unit it runs now has been running.

Every unit (a chunk of a prompt, a drain of batched steps, a /forward) is one submission;
a unit made of parts (a drain runs group after group) marks each part done. A unit or part
that runs far longer than the span's units take means the thread is stuck, however long
the queue behind it. The watchdog and GET /compute read `running_s`. Knows nothing
about HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread(ThreadPoolExecutor):
    """A one-worker executor that times the unit it runs."""

    def __init__(self, name: str = "drift-compute") -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._started: float | None = None  # time.monotonic() the running unit began
        self._waiting = 0  # units submitted and not yet begun

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            self._waiting += 1
        try:
            return super().submit(self._unit, fn, args, kwargs)
        except BaseException:  # shut down: nothing was queued
            with self._lock:
                self._waiting -= 1
            raise

    def _unit(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        with self._lock:
            self._waiting -= 1
            self._started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self._started = None

    def progressed(self) -> None:
        """(On the compute thread) The running unit finished a part of its own (a drain job
        of the step batcher runs group after group): time it from here."""
        with self._lock:
            if self._started is not None:
                self._started = time.monotonic()

    def running_s(self, now: float | None = None) -> float:
        """Seconds the running unit has run, or since it last `progressed` (0.0 when the
        thread is idle)."""
        started = self._started
        if started is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - started)

    @property
    def waiting(self) -> int:
        """Units queued behind the running one."""
        return self._waiting
