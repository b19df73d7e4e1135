"""One background asyncio event loop in a daemon thread, the client's async engine.

The synchronous face (nn.Module calls, generate()) submits coroutines here and waits for
their results; nothing else knows about threads. Closing runs a last coroutine (closing the
HTTP session), cancels what is left and stops the loop, from any thread, the loop's own too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from drift.openmp import worker_release

T = TypeVar("T")
CLOSE_TIMEOUT_S = 5.0  # seconds closing may wait for the loop's last work


class LoopThread:
    """An event loop running forever in its own daemon thread, until `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._release_workers = worker_release()  # drift.openmp
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="drift-client-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and block this (non-loop) thread until it finishes."""
        if self.closed:
            coro.close()
            raise RuntimeError("this DRIFT client is closed (model.close() was called, or the "
                               "model was collected): load the model again")  # fmt: skip
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from inside its own loop")
        future = asyncio.run_coroutine_threadsafe(self._released(coro), self.loop)
        self._release_workers()  # while the loop sends: no core spins through the wait
        return future.result(timeout)

    async def _released(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro`, then the end of this loop thread's OpenMP pool, if decoding a reply (a
        prompt's hidden states) gave it one: another pool in the process makes GNU OpenMP
        throttle every pool's workers, the caller's own torch work's included (drift.openmp)."""
        try:
            return await coro
        finally:
            self._release_workers()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start `coro` on the loop without waiting for it (from any thread); dropped once
        the loop is closed."""
        if self.closed:
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self, last: Coroutine[Any, Any, Any] | None = None, *, wait: bool = True) -> None:
        """Run `last`, cancel every task left and stop the loop; idempotent. `wait=False`
        (and a call from the loop's own thread) returns at once and lets the loop finish."""
        if self.closed:
            if last is not None:
                last.close()
            return
        self.closed = True
        finish = self._finish(last)
        if not self.loop.is_running():
            finish.close()
            return
        future = asyncio.run_coroutine_threadsafe(finish, self.loop)
        future.add_done_callback(lambda _: self.loop.call_soon_threadsafe(self.loop.stop))
        if wait and threading.current_thread() is not self._thread:
            with contextlib.suppress(Exception):
                future.result(CLOSE_TIMEOUT_S)
            self._thread.join(timeout=CLOSE_TIMEOUT_S)

    @staticmethod
    async def _finish(last: Coroutine[Any, Any, Any] | None) -> None:
        """Let running work (sockets closing) end, run `last`, then cancel what is left."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        if last is not None:
            with contextlib.suppress(Exception):
                await last
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
