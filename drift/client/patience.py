"""Waiting past a reply's timeout while the server says it is still working on the call.

A client times a step or a /forward, /backward call out after a few times that peer's
measured pace (drift.client.latency.StepTimeouts). Other clients' work queued on the same
server is not in that figure. Past the timeout the client asks the server (GET /compute,
drift.wire.progress) whether it holds the call and its compute advances, and waits another
timeout if so (`StepTimeouts.more_wait` decides), never past step_timeout_s in all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TypeVar

import aiohttp

import drift.client.calls as calls
import drift.client.transport as transport
from drift.client.config import ClientConfig
from drift.client.latency import StepTimeouts
from drift.client.routing import Hop
from drift.wire.errors import DriftError, PeerUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


def patience_for(http: aiohttp.ClientSession, config: ClientConfig, timeouts: StepTimeouts,
                 hop: Hop, window_s: float, started: float, *, session_id: str = "",
                 call_id: str = "") -> transport.Patience:  # fmt: skip
    """For a session's step (`session_id`) or a named call (`call_id`) on `hop`, waited on
    since `started` (time.perf_counter()): seconds more to wait once its timeout passed."""

    async def more() -> float:
        try:
            status = await calls.compute_status(http, hop, config, session_id=session_id,
                                                    call_id=call_id)  # fmt: skip
        except DriftError as exc:  # unreachable, or a server without /compute
            log.debug("%s did not say whether it is busy: %s", hop.peer_id, exc)
            status = None
        waited = time.perf_counter() - started
        more_s = timeouts.more_wait(status, waited, window_s)
        if status is None or more_s <= 0:
            log.debug("%s: no more wait after %.1f s (%s)", hop.peer_id, waited, status)
        else:
            log.info("%s is busy (its unit of work running %.1f s, %d queued): waiting %.1f s "
                     "more (%.1f s so far)", hop.peer_id, status.running_s, status.waiting,
                     more_s, waited)  # fmt: skip
        return more_s

    return more


async def patiently(task: asyncio.Future[T], timeout_s: float, more: transport.Patience,
                    what: str, peer_id: str) -> T:  # fmt: skip
    """`task`'s result within `timeout_s` and what `more` grants after it; else `task` is
    cancelled and PeerUnavailable(`what`) rises (also cancelled if this wait is)."""
    started, window = time.perf_counter(), timeout_s
    try:
        while not (await asyncio.wait({task}, timeout=window))[0]:
            window = await more()
            if window <= 0:
                raise PeerUnavailable(f"{what} within {time.perf_counter() - started:.1f} s",
                                      peer_id=peer_id)  # fmt: skip
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return task.result()
