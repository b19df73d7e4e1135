"""Swarms of real block servers on loopback, served from a background thread's event loop.

Tests written as Petals' and transformers' users write them are plain synchronous code:
the servers cannot share the test's thread, so they run on their own loop here
(tests/client/swarms.py starts them). `BackgroundSwarms` is what the `swarm` fixtures of
tests/compat/conftest.py hand out; `stop_all` (teardown) stops every server started.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from tests.client.swarms import Swarm, start_swarm, stop_swarm

T = TypeVar("T")
TIMEOUT_S = 120.0  # starting or stopping a swarm of tiny models takes seconds


class BackgroundSwarms:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="compat-swarms",
                                       daemon=True)  # fmt: skip
        self.thread.start()
        self.started: list[Swarm] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT_S)

    def start(self, model_dir: Path | str, spans: list[tuple[int, int]], **overrides: Any) -> Swarm:
        swarm = self.run(start_swarm(model_dir, spans, **overrides))
        self.started.append(swarm)
        return swarm

    def open_sessions(self, swarm: Swarm) -> list[int]:
        """How many inference sessions each server of `swarm` holds now."""

        async def count() -> list[int]:
            return [len(s.server.sessions.sessions) for s in swarm.servers]

        return self.run(count())

    def steps_served(self, swarm: Swarm) -> int:
        """Inference steps the servers of `swarm` answered so far (the first server's)."""
        return swarm.servers[0].server.metrics.requests[("/inference:step", "200")]

    def stop_all(self) -> None:
        try:
            while self.started:
                self.run(stop_swarm(self.started.pop()))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=TIMEOUT_S)
            self.loop.close()
