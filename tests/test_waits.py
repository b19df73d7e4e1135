"""drift.waits: a time limit that never loses the caller's cancellation (the node teardown
that hung: a gossip task cancelled as its TLS probe finished ran on forever)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from drift.waits import raise_if_cancelling, wait_for

ROOT = Path(__file__).resolve().parent.parent / "drift"


async def _cancelled_as_it_finishes(waiter) -> str:
    """Cancel a task in the same loop turn as the thing it awaits finishes; what it saw."""
    loop = asyncio.get_running_loop()
    inner = loop.create_future()

    async def caller() -> str:
        result = await waiter(inner, 5.0)
        return f"returned {result}"

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # the caller now waits
    inner.set_result(1)
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


async def test_a_cancellation_as_the_awaited_finishes_is_kept():
    assert await _cancelled_as_it_finishes(wait_for) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="fixed in CPython 3.12 (gh-86296)")
async def test_the_stdlib_wait_for_loses_it_here():
    """Why drift.waits exists: on this Python the same race loses the cancellation."""
    assert await _cancelled_as_it_finishes(asyncio.wait_for) == "returned 1"


async def test_time_limit_and_result():
    assert await wait_for(asyncio.sleep(0, result=7), 1.0) == 7
    assert await wait_for(asyncio.sleep(0, result=8), None) == 8
    with pytest.raises(TimeoutError):
        await wait_for(asyncio.sleep(5), 0.05)
    with pytest.raises(asyncio.TimeoutError):  # the same class on 3.11+, caught as before
        await wait_for(asyncio.sleep(5), 0.05)


async def test_a_forever_loop_stops_when_its_cancellation_was_swallowed():
    turns = 0

    async def swallow() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            pass  # as a third-party timeout or a stray except might

    async def loop() -> None:
        nonlocal turns
        while True:
            turns += 1
            await swallow()
            raise_if_cancelling()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done and task.cancelled()
    assert turns == 1


def test_drift_never_calls_asyncio_wait_for():
    """Every time-limited await in drift/ goes through drift.waits.wait_for."""
    calls = []
    for path in ROOT.rglob("*.py"):
        if path.name == "waits.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\basyncio\.wait_for\(|^\s*from asyncio import .*\bwait_for\b", code):
                calls.append(f"{path.relative_to(ROOT.parent)}:{n}")
    assert calls == []
