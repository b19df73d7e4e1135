"""Fixtures for client tests: tiny checkpoints and a swarm of real block servers on loopback.

Every block server comes from the server harness (tests/server/harness.py), so it runs the
real membership node app. The first server is the seed; the others join it with its join
token, and the client gets that same token as initial_peers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from drift.models.checkpoint import open_checkpoint
from tests.server.harness import RunningServer, start_block_server
from tests.tiny_models import save_tiny


@dataclass
class Swarm:
    model_dir: Path
    fingerprint: str
    num_blocks: int
    swarm_key: str | None = None
    servers: list[RunningServer] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)

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
            self.model_dir, start, end, swarm_key=self.swarm_key, initial_peers=peers, **kw
        )
        self.servers.append(running)
        await wait_for_members(self.seed, {s.node.peer_id for s in self.servers})
        return running

    async def stop(self, running: RunningServer) -> None:
        if running.node.peer_id not in self.stopped:
            self.stopped.add(running.node.peer_id)
            await running.stop()


async def wait_for_members(seed: RunningServer, peer_ids: set[str], timeout_s: float = 10.0):
    """Until the seed's own table lists every server in `peer_ids` as online with a span."""
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
    model_dir: Path, spans: list[tuple[int, int]], *, swarm_key: str | None = None
) -> Swarm:
    ckpt = open_checkpoint(str(model_dir))
    swarm = Swarm(model_dir, ckpt.fingerprint, ckpt.config.num_hidden_layers, swarm_key)
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


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_client")
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = save_tiny(family, root / family)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted (float32) from its GGUF into a checkpoint dir, once per
    run."""
    import torch

    cache = tmp_path_factory.mktemp("client-smollm2")
    return Path(open_checkpoint("smollm2", cache_dir=cache, dtype=torch.float32).path)
