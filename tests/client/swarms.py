"""Swarms of real block servers on loopback for client tests, and SDK models opened on them.

Every block server comes from the server harness (tests/server/harness.py), so it runs the
real membership node app. The first server is the seed; the others join it with its join
token, and the client gets that same token as initial_peers. `Swarms` and `SdkModels` are
what the fixtures of tests/client/conftest.py hand out: they stop (close) all they started.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drift.client import AutoDistributedModelForCausalLM
from drift.models.checkpoint import open_checkpoint
from tests.server.harness import RunningServer, start_block_server


@dataclass
class Swarm:
    model_dir: Path | str  # a checkpoint dir, or an alias opened in the servers' cache_dir
    fingerprint: str
    num_blocks: int
    swarm_key: str | None = None
    servers: list[RunningServer] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)
    server_overrides: dict[str, Any] = field(default_factory=dict)  # ServerConfig fields

    @property
    def seed(self) -> RunningServer:
        return self.servers[0]

    @property
    def token(self) -> str:
        """The seed's real join token (without the key: tests pass swarm_key= explicitly)."""
        return self.seed.node.join_token().to_drift(with_key=False)

    def by_peer(self, peer_id: str) -> RunningServer:
        return next(s for s in self.servers if s.node.peer_id == peer_id)

    async def add_server(self, start: int, end: int, **kw: Any) -> RunningServer:
        peers = (self.seed.node.join_token(),) if self.servers else ()
        running = await start_block_server(
            Path(self.model_dir), start, end, swarm_key=self.swarm_key, initial_peers=peers,
            **(self.server_overrides | kw),
        )  # fmt: skip
        self.servers.append(running)
        await wait_for_members(self.seed, {s.node.peer_id for s in self.servers})
        for other in self.servers:  # a client reads its table from any member, not the seed
            if other is not running and other.node.peer_id not in self.stopped:
                await wait_for_members(other, {running.node.peer_id})
        return running

    async def stop(self, running: RunningServer) -> None:
        if running.node.peer_id not in self.stopped:
            self.stopped.add(running.node.peer_id)
            await running.stop()


async def wait_for_members(seed: RunningServer, peer_ids: set[str], timeout_s: float = 10.0):
    """Until `seed`'s own table lists every server in `peer_ids` as online with a span."""
    deadline = time.monotonic() + timeout_s
    while True:
        online = {
            r.peer_id
            for r in seed.node.live_records()
            if r.state == "online" and r.end_block is not None
        }
        if peer_ids <= online:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"seed lists {sorted(online)}, waiting for {sorted(peer_ids)}")
        await asyncio.sleep(0.05)


async def start_swarm(
    model_dir: Path | str, spans: list[tuple[int, int]], *, swarm_key: str | None = None,
    **server_overrides: Any,
) -> Swarm:  # fmt: skip
    """Servers for `spans` (the first is the seed); all stopped again if one fails to start.

    `server_overrides` are ServerConfig fields for every server (e.g. cache_dir= to open an
    alias from a prepared cache)."""
    ckpt = open_checkpoint(str(model_dir), cache_dir=server_overrides.get("cache_dir"))
    blocks = ckpt.config.get_text_config().num_hidden_layers  # a multimodal one: its text tower
    swarm = Swarm(model_dir, ckpt.fingerprint, blocks, swarm_key,
                  server_overrides=server_overrides)  # fmt: skip
    try:
        for start, end in spans:
            await swarm.add_server(start, end)
    except BaseException:
        await stop_swarm(swarm)
        raise
    return swarm


async def stop_swarm(swarm: Swarm) -> None:
    for running in reversed(swarm.servers):
        await swarm.stop(running)


class Swarms:
    """`await swarms.start(model_dir, spans, ...)`: swarms stopped by `stop_all` (teardown)."""

    def __init__(self) -> None:
        self.started: list[Swarm] = []

    async def start(
        self, model_dir: Path | str, spans: list[tuple[int, int]], *,
        swarm_key: str | None = None, **server_overrides: Any,
    ) -> Swarm:  # fmt: skip
        swarm = await start_swarm(model_dir, spans, swarm_key=swarm_key, **server_overrides)
        self.started.append(swarm)
        return swarm

    async def stop_all(self) -> None:
        while self.started:
            await stop_swarm(self.started.pop())


class SdkModels:
    """Distributed models opened off the event loop (the servers run on it); `close_all`
    (teardown) closes each in a thread, before the swarms stop."""

    def __init__(self) -> None:
        self._to_close: list[Callable[[], Any]] = []  # each returns a model or None

    async def open(self, name_or_dir: Path | str, initial_peers: str, *,
                   cls: Any = AutoDistributedModelForCausalLM, **kwargs: Any) -> Any:  # fmt: skip
        """`cls.from_pretrained(name_or_dir, initial_peers=..., **kwargs)` in a thread."""
        model = await asyncio.to_thread(
            cls.from_pretrained, name_or_dir, initial_peers=initial_peers, **kwargs
        )
        self._to_close.append(lambda: model)
        return model

    def close_later(self, get_model: Callable[[], Any]) -> None:
        """Close what `get_model()` returns at teardown (a model built by code the test
        runs, e.g. README's example; None when that code never got so far)."""
        self._to_close.append(get_model)

    async def close_all(self) -> None:
        while self._to_close:
            model = self._to_close.pop()()
            if model is not None:
                await asyncio.to_thread(model.close)
