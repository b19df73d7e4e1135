"""Start and stop a node app on a port; run it until Ctrl+C / SIGTERM, then leave gracefully.

Signals reach the loop through `install_stop_handlers`, which works where the loop has no
`add_signal_handler` (Windows) too.

Shared by `drift dht`, `drift server` and `drift up`. Binding tells the MembershipNode
its real port, which starts its join and gossip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from drift.identity.tls import server_context
from drift.node.app import NODE

log = logging.getLogger(__name__)
# what runs after a stop signal, before the node stops listening (a server's drain); a
# second signal cancels it and the node stops at once
BEFORE_STOP = web.AppKey("before_stop", list[Callable[[], Awaitable[None]]])


@dataclass
class RunningApp:
    """A started app: its runner and the port it really listens on."""

    runner: web.AppRunner
    host: str
    port: int

    async def stop(self) -> None:
        """Stop listening; the app's cleanup sends the offline record and ends gossip."""
        await self.runner.cleanup()


async def start_app(
    app: web.Application, host: str, port: int, *, shutdown_timeout_s: float = 2.0,
    idle_timeout_s: float | None = None,
) -> RunningApp:  # fmt: skip
    """Listen on host:port (0 = a free port) and bind the node to the real port; with the
    node's `tls`, behind a certificate bound to its identity. A connection that sends no
    request for `idle_timeout_s` (default: the node's) is closed."""
    node = app.get(NODE)
    if idle_timeout_s is None:
        idle_timeout_s = node.config.idle_timeout_s if node is not None else 30.0
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout_s, access_log=None,
                           keepalive_timeout=idle_timeout_s)  # fmt: skip
    await runner.setup()
    tls = server_context(node.identity) if node is not None and node.config.tls else None
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = int(runner.addresses[0][1])
    if node is not None:
        node.bind(bound)
    return RunningApp(runner, host, bound)


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGBREAK")  # SIGBREAK: Ctrl+Break on Windows


def install_stop_handlers(
    loop: asyncio.AbstractEventLoop, on_signal: Callable[[int], None]
) -> Callable[[], None]:
    """Call `on_signal(signum)` on the loop for SIGINT / SIGTERM (/ SIGBREAK); the undo.

    `loop.add_signal_handler` where the loop has it (Unix); else (Windows' proactor loop
    raises NotImplementedError) plain `signal.signal` handlers that hand the signal to the
    loop thread-safely, restored by the returned undo.
    """
    sigs = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]
    try:
        for sig in sigs:
            loop.add_signal_handler(sig, on_signal, sig)
    except (NotImplementedError, RuntimeError):
        previous = {}
        for sig in sigs:
            with contextlib.suppress(OSError, ValueError):  # not settable on this platform
                previous[sig] = signal.signal(
                    sig, lambda signum, _frame: loop.call_soon_threadsafe(on_signal, signum)
                )

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def remove() -> None:
        for sig in sigs:
            loop.remove_signal_handler(sig)

    return remove


async def _before_stop(app: web.Application, stop: asyncio.Event) -> None:
    """The app's BEFORE_STOP hooks, until done or a second signal comes."""
    hooks = app.get(BEFORE_STOP, [])
    if not hooks:
        return
    stop.clear()
    log.info("stopping: draining first (signal again to stop at once)")
    work: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(h() for h in hooks)))
    again: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    await asyncio.wait([work, again], return_when=asyncio.FIRST_COMPLETED)
    again.cancel()
    if not work.done():
        log.warning("second signal: stopping at once")
        work.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await work
    if work.done() and not work.cancelled() and work.exception() is not None:
        log.error("drain failed: %r", work.exception())


def run_node(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_started: Callable[[RunningApp], Awaitable[None] | None] | None = None,
) -> int:
    """Serve `app` until SIGINT/SIGTERM, then stop gracefully. Returns the bound port after
    SIGTERM; raises KeyboardInterrupt after SIGINT (Ctrl+C), once the node has left."""

    async def main() -> tuple[int, int | None]:
        stop = asyncio.Event()
        received: list[int] = []

        def on_signal(signum: int) -> None:
            received.append(signum)
            stop.set()

        undo = install_stop_handlers(asyncio.get_running_loop(), on_signal)
        try:
            running = await start_app(app, host, port)
            try:
                if on_started is not None:
                    result = on_started(running)
                    if asyncio.iscoroutine(result):
                        await result
                await stop.wait()
                await _before_stop(app, stop)
                log.info("stopping (signal received): leaving the swarm")
            finally:
                await running.stop()
        finally:
            undo()
        return running.port, (received[0] if received else None)

    bound, signum = asyncio.run(main())
    if signum is not None and signum != getattr(signal, "SIGTERM", None):
        raise KeyboardInterrupt  # Ctrl+C: the caller exits as interrupted (130)
    return bound
