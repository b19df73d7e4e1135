"""Start a real block server in-process on 127.0.0.1 (port 0) for tests; stop it after.

`start_block_server(model_dir, start, end, **config)` -> RunningServer (url, server, stop).
Mounts the compute routes on the node app when drift.node provides one (with a fresh
identity), else on a bare aiohttp app. Reused by the client SDK tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from drift.server.build import attach_server, load_server
from drift.server.config import ServerConfig
from drift.server.state import BlockServer


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:<port>
    server: BlockServer
    runner: web.AppRunner
    node: Any | None = None

    async def stop(self) -> None:
        await self.runner.cleanup()


def _node_app(tmp_dir: Path | None, swarm_key: str | None) -> tuple[web.Application, Any]:
    try:
        from drift.node.harness import make_node  # type: ignore[import-not-found]

        from drift.node.app import build_node_app  # type: ignore[import-not-found]
    except ImportError:
        from drift.node.middleware import error_middleware

        return web.Application(middlewares=[error_middleware]), None
    node = make_node(tmp_dir, swarm_key=swarm_key)  # pragma: no cover - when node lands
    return build_node_app(node), node


async def start_block_server(
    model_dir: Path, start_block: int, end_block: int, *, swarm_key: str | None = None,
    tmp_dir: Path | None = None, **overrides: Any,
) -> RunningServer:  # fmt: skip
    """A real server for blocks [start_block, end_block) of the checkpoint at model_dir."""
    config = ServerConfig(
        model=str(model_dir), start_block=start_block, end_block=end_block, device="cpu",
        throughput=overrides.pop("throughput", 100.0),
    )  # fmt: skip
    config = dataclasses.replace(config, **overrides)
    server = load_server(config)
    app, node = _node_app(tmp_dir, swarm_key)
    attach_server(app, server, node)
    runner = web.AppRunner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return RunningServer(f"http://127.0.0.1:{port}", server, runner, node)
