"""The compute thread times the unit it runs (drift.server.compute_thread), the watchdog
reads that, and GET /compute tells a client whether its step is there and the thread
advances (drift.wire.progress)."""

from __future__ import annotations

import threading
import time

import pytest

from drift.server.compute_thread import ComputeThread
from drift.server.watchdog import ComputeWatchdog
from drift.wire.errors import BadRequest
from drift.wire.progress import ComputeStatus


def test_the_running_unit_is_timed_and_the_queue_counted():
    thread = ComputeThread()
    release = threading.Event()
    try:
        assert thread.running_s() == 0.0 and thread.waiting == 0
        first = thread.submit(release.wait, 10)
        queued = [thread.submit(time.sleep, 0) for _ in range(3)]
        time.sleep(0.3)
        assert 0.25 <= thread.running_s() < 5
        assert thread.waiting == 3
        release.set()
        assert first.result(10) is True
        for f in queued:
            f.result(10)
        assert thread.running_s() == 0.0 and thread.waiting == 0
        with pytest.raises(ZeroDivisionError):  # a unit's error reaches its caller
            thread.submit(lambda: 1 / 0).result(10)
        assert thread.running_s() == 0.0
    finally:
        release.set()
        thread.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        thread.submit(time.sleep, 0)
    assert thread.waiting == 0


def test_a_long_queue_of_short_units_is_busy_not_degraded():
    """Before: a probe queued behind 1.5 s of 50 ms units waited past a 0.5 s bound and the
    server announced itself degraded while every unit ended in time."""
    thread = ComputeThread()
    watchdog = ComputeWatchdog(thread, bound_s=0.5)
    try:
        units = [thread.submit(time.sleep, 0.05) for _ in range(30)]
        seen = []
        while not units[-1].done():
            seen.append(watchdog.check())
            time.sleep(0.05)
        assert seen and max(seen) == 0.0 and not watchdog.degraded
        release = threading.Event()
        stuck = thread.submit(release.wait, 10)
        time.sleep(0.8)
        assert watchdog.check() >= 0.5 and watchdog.degraded  # one unit past the bound
        release.set()
        stuck.result(10)
        assert watchdog.check() == 0.0 and not watchdog.degraded
    finally:
        thread.shutdown(wait=True)


def test_compute_status_round_trips_and_refuses_bad_fields():
    status = ComputeStatus(0.25, 2, None, True)
    assert ComputeStatus.from_wire(status.to_wire()) == status
    for bad in ({"running_s": -1}, {"running_s": "1"}, {"waiting": -1}, {"pending": "yes"},
                {"unit_s": True}, {"type": "other"}):  # fmt: skip
        with pytest.raises(BadRequest):
            ComputeStatus.from_wire(status.to_wire() | bad)


def test_a_unit_made_of_parts_is_timed_from_its_latest_part():
    thread = ComputeThread()

    def parts() -> None:
        for _ in range(4):
            time.sleep(0.2)
            thread.progressed()

    try:
        unit = thread.submit(parts)
        seen = []
        while not unit.done():
            seen.append(thread.running_s())
            time.sleep(0.02)
        assert 0.1 < max(seen) < 0.5  # never the whole 0.8 s
    finally:
        thread.shutdown(wait=True)
