"""The aiohttp app every node runs: health, swarm table, gossip, coverage, dashboard.

Routes parse, call the MembershipNode, serialise. The error and swarm-key middlewares
wrap every route, including the compute routes drift/server adds to this same app.
The gossip loop and the HTTP client live in cleanup_ctx; leaving happens at cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from drift.node.auth import auth_middleware
from drift.node.body import BODY_BUDGET, BodyBudget, body_middleware, read_body
from drift.node.gossip import gossip_body_limit
from drift.node.membership import MembershipNode
from drift.node.middleware import error_middleware
from drift.swarm import coverage
from drift.wire.errors import BadRequest, NotFound

log = logging.getLogger(__name__)

NODE = web.AppKey("node", MembershipNode)
WEB_DIR = web.AppKey("web_dir", object)  # Path | None

_NO_DASHBOARD = (
    "DRIFT node {peer_id}\n\nThe dashboard is not installed (no web/ directory found).\n"
    "JSON: /health, /swarm, /swarm/coverage\n"
)


def find_web_dir() -> Path | None:
    """drift/_web when installed from a wheel, else the repository's web/, else None."""
    package = Path(__file__).resolve().parent.parent  # drift/
    for candidate in (package / "_web", package.parent / "web"):
        if candidate.is_dir():
            return candidate
    return None


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return _json({"status": "ok", "peer_id": node.peer_id, "version": node.config.version})


async def swarm(request: web.Request) -> web.Response:
    return _json(request.app[NODE].swarm_payload())


async def gossip(request: web.Request) -> web.Response:
    node = request.app[NODE]
    limit = gossip_body_limit(node.config.max_gossip_records)
    body = await read_body(
        request,
        limit,
        idle_timeout_s=node.config.idle_timeout_s,
        limit_name="the gossip body limit (max_gossip_records)",
    )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"gossip body is not JSON: {exc}") from exc
    return _json(node.handle_gossip(data, sender=request.remote or ""))


async def swarm_coverage(request: web.Request) -> web.Response:
    model = request.query.get("model") or None
    return _json(coverage(request.app[NODE].live_records(), model).to_wire())


async def index(request: web.Request) -> web.StreamResponse:
    web_dir = request.app[WEB_DIR]
    if isinstance(web_dir, Path) and (web_dir / "index.html").is_file():
        return web.FileResponse(web_dir / "index.html")
    text = _NO_DASHBOARD.format(peer_id=request.app[NODE].peer_id)
    return web.Response(text=text, content_type="text/plain")


async def static(request: web.Request) -> web.StreamResponse:
    web_dir = request.app[WEB_DIR]
    rel = request.match_info["path"]
    if isinstance(web_dir, Path):
        root = web_dir.resolve()
        target = (root / rel).resolve()
        if target.is_relative_to(root) and target.is_file():
            return web.FileResponse(target)
    raise NotFound(f"no static file {rel!r}")


async def _membership_ctx(app: web.Application) -> AsyncIterator[None]:
    node = app[NODE]
    if not node.config.swarm_key:
        log.warning("no swarm key: this swarm is OPEN, anyone who can reach it may join")
    node.http = aiohttp.ClientSession()
    task = asyncio.create_task(node.run_gossip(), name="drift-gossip")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await node.cancel_inflight()
        try:
            await node.leave()
        finally:
            await node.http.close()
            node.http = None


def build_node_app(node: MembershipNode, *, web_dir: Path | None = None) -> web.Application:
    """The node app; drift/server adds its compute routes to it before it starts."""
    cfg = node.config
    app = web.Application(
        middlewares=[
            error_middleware,
            body_middleware,
            auth_middleware(cfg.swarm_key, node.peer_id, max_skew_s=cfg.auth_max_skew_s),
        ],
        client_max_size=cfg.client_max_size,
    )
    app[NODE] = node
    app[BODY_BUDGET] = BodyBudget(cfg.max_body_memory)
    app[WEB_DIR] = web_dir or find_web_dir()
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/swarm", swarm)
    app.router.add_post("/swarm/gossip", gossip)
    app.router.add_get("/swarm/coverage", swarm_coverage)
    app.router.add_get("/static/{path:.+}", static)
    app.cleanup_ctx.append(_membership_ctx)
    return app
