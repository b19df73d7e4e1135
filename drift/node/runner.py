"""Start and stop a node app on a port; run it until Ctrl+C / SIGTERM, then leave gracefully.

Shared by `drift dht`, `drift server` and `drift up`. Binding tells the MembershipNode
its real port, which starts its join and gossip.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from drift.identity.tls import server_context
from drift.node.app import NODE

log = logging.getLogger(__name__)


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


def run_node(
    app: web.Application,
    host: str,
    port: int,
    *,
    on_started: Callable[[RunningApp], Awaitable[None] | None] | None = None,
) -> int:
    """Serve `app` until SIGINT/SIGTERM, then stop gracefully. Returns the bound port."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        running = await start_app(app, host, port)
        try:
            if on_started is not None:
                result = on_started(running)
                if asyncio.iscoroutine(result):
                    await result
            await stop.wait()
            log.info("stopping (signal received): leaving the swarm")
        finally:
            await running.stop()
        return running.port

    return asyncio.run(main())
