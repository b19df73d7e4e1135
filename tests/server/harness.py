"""Start a real block server in-process on 127.0.0.1 (port 0) for tests; stop it after.

`start_block_server(model_dir, start, end, **config)` -> RunningServer (url, server, node,
stop). The compute routes are mounted on a real membership node app (fresh identity,
optional swarm key and seeds), as `drift server` does. Reused by the client SDK tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from drift.identity import Identity
from drift.models.checkpoint import open_checkpoint
from drift.node import MembershipNode, NodeConfig, RunningApp, build_node_app, start_app
from drift.server.build import attach_server, load_server
from drift.server.config import ServerConfig
from drift.server.parts import PartsService, add_parts_routes
from drift.server.state import BlockServer


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:<port>
    server: BlockServer
    node: MembershipNode
    running: RunningApp

    async def stop(self) -> None:
        await self.running.stop()


async def start_block_server(
    model_dir: Path, start_block: int, end_block: int, *, swarm_key: str | None = None,
    initial_peers: tuple[Any, ...] = (), node: dict[str, Any] | None = None,
    parts_cache: Path | None = None, **overrides: Any,
) -> RunningServer:  # fmt: skip
    """A real server for blocks [start_block, end_block) of the checkpoint at model_dir.

    `overrides` are ServerConfig fields (throughput defaults to 100 to skip the benchmark;
    decode steps keep torch's threads: this process's torch is the test's too),
    `node` NodeConfig fields; `parts_cache`: also serve the client parts (drift.server.parts),
    prepared under that dir, as `drift server` does.
    """
    config = ServerConfig(
        model=str(model_dir), start_block=start_block, end_block=end_block, device="cpu",
        throughput=100.0, decode_threads=0,
    )  # fmt: skip
    config = dataclasses.replace(config, **overrides)
    server = await asyncio.to_thread(load_server, config)  # the loop's servers keep gossiping
    node = MembershipNode(
        Identity.generate(),
        NodeConfig(
            host="127.0.0.1",
            port=0,
            swarm_key=swarm_key,
            initial_peers=initial_peers,
            gossip_interval_s=0.5,
            record_ttl_s=5.0,
            client_max_size=config.max_body_bytes,
            **(node or {}),
        ),  # fmt: skip
    )
    app = build_node_app(node)
    attach_server(app, server, node)
    if parts_cache is not None:
        ckpt = open_checkpoint(config.model, cache_dir=config.cache_dir)
        add_parts_routes(app, PartsService(ckpt, parts_cache))
    running = await start_app(app, "127.0.0.1", 0)
    return RunningServer(f"http://127.0.0.1:{running.port}", server, node, running)


async def tokens_total(url: str, *, ssl: Any = None) -> int:
    """A server's drift_tokens_total (tokens through its span), read from its /metrics at
    `url` (`ssl`: e.g. drift.swarm.dial.peer_ssl(peer_id) for a TLS server)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics", ssl=ssl) as resp:
        text = await resp.text()
    found = re.search(r"^drift_tokens_total (\S+)$", text, re.M)
    assert found, text[:500]
    return int(float(found.group(1)))
