"""A membership swarm on loopback for the dashboard tests: a seed node, block servers of a
tiny 6-block llama, the fixtures that start and stop them, and what the page's rows read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from transformers import AutoModelForCausalLM

from drift.identity import Identity
from drift.node.app import build_node_app
from drift.node.config import NodeConfig
from drift.node.membership import MembershipNode
from drift.node.runner import RunningApp, start_app
from tests.server.harness import RunningServer, start_block_server
from tests.tiny_models import tiny_config

NUM_BLOCKS = 6
ROWS = "[...document.querySelectorAll('[data-testid=server-row]')]"
MISSING = "[...document.querySelectorAll('[data-missing=true]')].map(e => +e.dataset.block)"
REFRESHES = "+document.body.dataset.refreshes"


@pytest.fixture(scope="module")
def tiny_llama6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama of tests/tiny_models.py with 6 blocks, saved as safetensors."""
    config = tiny_config("llama")
    config.num_hidden_layers = NUM_BLOCKS
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    directory = tmp_path_factory.mktemp("web") / "tiny-llama-6"
    model.save_pretrained(directory, safe_serialization=True)
    return directory


class Swarm:
    """A membership seed plus real block servers on 127.0.0.1; all stopped by `close`."""

    def __init__(self, model_dir: Path | None = None, swarm_key: str | None = None) -> None:
        self.model_dir = model_dir
        self.swarm_key = swarm_key
        self.runners: list[RunningApp | RunningServer] = []
        self.nodes: list[MembershipNode] = []

    async def add_seed(self, spy: list[dict[str, str]] | None = None) -> MembershipNode:
        """The seed; with `spy`, the headers of every request it gets are appended to it."""
        config = NodeConfig(
            host="127.0.0.1", port=0, swarm_key=self.swarm_key, gossip_interval_s=0.3,
            request_timeout_s=2.0,
        )  # fmt: skip
        node = MembershipNode(Identity.generate(), config)
        app = build_node_app(node)
        if spy is not None:

            @web.middleware
            async def record(request: web.Request, handler):  # type: ignore[no-untyped-def]
                spy.append(dict(request.headers))
                return await handler(request)

            app.middlewares.insert(0, record)
        self.runners.append(await start_app(app, "127.0.0.1", 0))
        self.nodes.append(node)
        return node

    async def add_server(self, start: int, end: int, **config: Any) -> RunningServer:
        assert self.model_dir is not None and self.nodes, "add_seed first"
        server = await start_block_server(
            self.model_dir, start, end, swarm_key=self.swarm_key,
            initial_peers=(self.nodes[0].join_token(),), **config,
        )  # fmt: skip
        self.runners.append(server)
        self.nodes.append(server.node)
        return server

    @staticmethod
    def url(node: MembershipNode) -> str:
        return node.addrs[0].rstrip("/") + "/"

    async def close(self) -> None:
        while self.runners:
            await self.runners.pop().stop()


@pytest.fixture
async def swarms() -> AsyncIterator[Callable[..., Swarm]]:
    """`swarms(model_dir=None, swarm_key=None)` -> an empty Swarm; all closed at teardown."""
    made: list[Swarm] = []

    def make(model_dir: Path | None = None, swarm_key: str | None = None) -> Swarm:
        made.append(Swarm(model_dir, swarm_key))
        return made[-1]

    try:
        yield make
    finally:
        for s in made:
            await s.close()


@pytest.fixture
def swarm(swarms: Callable[..., Swarm], tiny_llama6: Path) -> Swarm:
    return swarms(tiny_llama6)


async def wait_all_see(swarm: Swarm, count: int, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if all(len(n.live_records()) >= count for n in swarm.nodes):
            return
        await asyncio.sleep(0.1)
    seen = [len(n.live_records()) for n in swarm.nodes]
    raise AssertionError(f"gossip did not converge to {count} records: {seen}")
