"""Start real membership nodes on 127.0.0.1 (port 0) inside the test's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from drift.identity import Identity, JoinToken
from drift.node import MembershipNode, NodeConfig, RunningApp, build_node_app, start_app

FAST = NodeConfig(
    host="127.0.0.1",
    port=0,
    gossip_interval_s=0.2,
    fanout=3,
    record_ttl_s=2.0,
    request_timeout_s=2.0,
    leave_timeout_s=1.0,
)


class Nodes:
    """Started nodes, stopped by `stop_all` (the `nodes` fixture's teardown)."""

    def __init__(self) -> None:
        self.running: list[tuple[MembershipNode, RunningApp]] = []

    async def start(
        self, *seeds: JoinToken, identity: Identity | None = None, web_dir: Path | None = None,
        **overrides: object,
    ) -> tuple[MembershipNode, RunningApp]:  # fmt: skip
        config = dataclasses.replace(FAST, initial_peers=tuple(seeds), **overrides)
        node = MembershipNode(identity or Identity.generate(), config)
        running = await start_app(build_node_app(node, web_dir=web_dir), "127.0.0.1", 0)
        self.running.append((node, running))
        return node, running

    async def stop(self, node: MembershipNode) -> None:
        for i, (n, running) in enumerate(self.running):
            if n is node:
                del self.running[i]
                await running.stop()
                return

    async def kill(self, node: MembershipNode) -> None:
        """Stop without the graceful leave (like SIGKILL: no offline record is sent)."""

        async def no_leave() -> None:
            return None

        node.leave = no_leave  # type: ignore[method-assign]
        await self.stop(node)

    async def stop_all(self) -> None:
        while self.running:
            await self.stop(self.running[-1][0])


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll `cond` until true (AssertionError on timeout)."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or cond}")
        await asyncio.sleep(0.05)


def live_ids(node: MembershipNode) -> set[str]:
    return {r.peer_id for r in node.live_records()}
