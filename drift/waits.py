"""Awaiting with a time limit that never loses the caller's cancellation.

Python 3.11's `asyncio.wait_for` returns the result when the awaited thing finishes in the
same loop turn as the caller is cancelled (CPython gh-86296, fixed in 3.12): the cancellation
is gone. A forever loop (a node's gossip) that awaited it then ran on and its app's cleanup,
which cancels it and waits, never finished (a test's teardown hung until its 600 s limit).
`wait_for` here awaits in the caller's own task under `asyncio.timeout` (3.11+), where a
cancellation always arrives. DRIFT calls this, never `asyncio.wait_for` (tests/test_waits.py
checks). A leaf module: no drift imports.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout_s: float | None) -> T:
    """`await aw`, raising TimeoutError after `timeout_s` (None: no limit); a cancellation of
    the caller is always raised, even where `aw` finished in the same turn."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await aw
    return await asyncio.wait_for(aw, timeout_s)  # 3.10: no asyncio.timeout


def raise_if_cancelling() -> None:
    """Raise CancelledError where the current task has a cancellation pending that something
    it awaited swallowed (3.11+: `Task.cancelling()`): a forever loop calls this each turn,
    so a stray `except` or a third-party timeout cannot keep it running after it was told
    to stop."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError
