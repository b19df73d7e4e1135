"""Fixtures for client tests: tiny checkpoints and a swarm of real block servers on loopback.

Block servers come from the server harness (tests/server/harness.py). Until every block
server is a membership node, a small stand-in node serves GET /swarm with records signed by
the servers' identities (drift.swarm.record.sign_record) so the client's verification runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from drift import __version__
from drift.identity.keys import Identity
from drift.models.checkpoint import open_checkpoint
from drift.swarm.record import default_fields, sign_record
from tests.server.harness import RunningServer, start_block_server
from tests.tiny_models import save_tiny


@dataclass
class Swarm:
    seed: web.AppRunner
    seed_url: str
    seed_identity: Identity
    model_dir: Path
    fingerprint: str
    num_blocks: int
    servers: list[tuple[RunningServer, Identity, int, int]] = field(default_factory=list)

    @property
    def token(self) -> str:
        host_port = self.seed_url.removeprefix("http://")
        return f"drift://{self.seed_identity.peer_id}@{host_port}"

    def records(self) -> list[dict[str, Any]]:
        out = []
        for i, (running, ident, start, end) in enumerate(self.servers):
            fields = default_fields(ident.peer_id, [running.url], __version__)
            fields.update(
                role="server", model=self.model_dir.name, model_fingerprint=self.fingerprint,
                num_blocks=self.num_blocks, start_block=start,
                end_block=end, state="online", dtype="float32", quant="none",
                throughput=100.0, cache_tokens_left=1 << 20, cache_tokens_total=1 << 20,
                seq=i + 1, expires_at=time.time() + 3600,
            )  # fmt: skip
            out.append(sign_record(ident, fields).to_wire())
        return out

    async def add_server(self, start: int, end: int, **kw: Any) -> RunningServer:
        running = await start_block_server(self.model_dir, start, end, **kw)
        self.servers.append((running, Identity.generate(), start, end))
        return running


async def start_swarm(model_dir: Path, spans: list[tuple[int, int]]) -> Swarm:
    ckpt = open_checkpoint(str(model_dir))
    ident = Identity.generate()
    holder: dict[str, Swarm] = {}

    async def swarm_route(request: web.Request) -> web.Response:
        return web.json_response({"peer_id": ident.peer_id, "records": holder["s"].records()})

    app = web.Application()
    app.router.add_get("/swarm", swarm_route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    n = ckpt.config.num_hidden_layers
    swarm = Swarm(runner, url, ident, model_dir, ckpt.fingerprint, n)
    holder["s"] = swarm
    for start, end in spans:
        await swarm.add_server(start, end)
    return swarm


async def stop_swarm(swarm: Swarm) -> None:
    for running, *_ in swarm.servers:
        await running.stop()
    await swarm.seed.cleanup()


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_client")
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = save_tiny(family, root / family)
        return cache[family]

    return get
