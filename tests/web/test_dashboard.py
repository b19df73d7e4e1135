"""The dashboard in a real headless Chromium against a real swarm on loopback.

A membership seed and real block servers of a 6-block tiny llama (tests/server/harness.py)
covering [0, 2) and [2, 4) gossip over HTTP: the seed's page must list every server with
its span and mark blocks 4-5 missing; a real server for [4, 6) must clear the marks without
a reload; a server's row shows what its /blocks says (dtype, cache in use, sessions) and
follows an inference session opening and closing; a non-seed node's page shows the same
swarm; a private swarm asks for its key. Skipped when /usr/bin/chromium is absent
(scripts/ci_system_deps.sh installs it). DRIFT_DASHBOARD_PNG=<path> also writes the
1280 px screenshot there (docs/dashboard.png comes from scripts/dashboard_screenshot.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from aiohttp import web
from transformers import AutoModelForCausalLM

from drift.identity import Identity
from tests.tiny_models import tiny_config
from tests.web.cdp import CHROMIUM, Browser

if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} not found: install Debian's chromium (scripts/ci_system_deps.sh)",
        allow_module_level=True,
    )
try:
    from drift.node.app import build_node_app
    from drift.node.config import NodeConfig
    from drift.node.membership import MembershipNode
    from drift.node.runner import RunningApp, start_app
    from tests.server.harness import RunningServer, start_block_server
    from tests.server.wsclient import RawSession
except ImportError as exc:  # pragma: no cover - until drift/node's app lands
    pytest.skip(f"drift.node app not built yet: {exc}", allow_module_level=True)

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


async def rows(page: Browser) -> dict[str, str]:
    return await page.evaluate(
        f"Object.fromEntries({ROWS}.map(r => [r.dataset.peerId, "
        "r.querySelector('[data-testid=span]').textContent]))"
    )


def row_cells(peer_id: str) -> str:
    """JS: [dtype, quant, cache in use, sessions] as shown in the row of peer_id."""
    row = f"document.querySelector('[data-testid=server-row][data-peer-id=\"{peer_id}\"]')"
    return (
        f"(r => r && ['dtype', 'quant', 'cache', 'sessions']"
        f".map(t => r.querySelector(`[data-testid=${{t}}]`).textContent))({row})"
    )


def expected_cells(blocks: dict) -> list[str]:
    """What the row must show for a server whose GET /blocks answered `blocks`."""
    total, left = blocks["cache_tokens_total"], blocks["cache_tokens_left"]
    return [blocks["dtype"], blocks["quant"], f"{total - left:,} / {total:,}",
            str(blocks["active_sessions"])]  # fmt: skip


async def get_blocks(http: aiohttp.ClientSession, server: RunningServer) -> dict:
    async with http.get(f"{server.url}/blocks") as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def wait_row(page: Browser, peer_id: str, want: list[str], max_refreshes: int) -> None:
    """The row shows `want` within max_refreshes polls of the page, without a reload."""
    before = await page.evaluate(REFRESHES)
    expr = f"JSON.stringify({row_cells(peer_id)}) === {json.dumps(json.dumps(want, separators=(',', ':')))}"
    await page.wait_for(expr, timeout=2.5 * max_refreshes + 5)
    took = await page.evaluate(REFRESHES) - before
    assert took <= max_refreshes, f"the row showed {want} only after {took} refreshes"


@pytest.mark.timeout(240)
async def test_dashboard_shows_real_swarm(swarm: Swarm, tmp_path: Path) -> None:
    seed = await swarm.add_seed()
    a = await swarm.add_server(0, 2)
    b = await swarm.add_server(2, 4, quant_type="int8")  # a swarm may mix quantizations
    await wait_all_see(swarm, 3)
    model = a.server.backend.model_name

    async with Browser.start() as page, aiohttp.ClientSession() as http:
        await page.set_viewport(1280, 900)
        await page.set_color_scheme("light")
        await page.navigate(swarm.url(seed))
        await page.wait_for(f"{ROWS}.length === 3 && {MISSING}.length === 2")
        assert await rows(page) == {seed.peer_id: "—", a.node.peer_id: "[0, 2)",
                                    b.node.peer_id: "[2, 4)"}  # fmt: skip
        assert await page.evaluate(MISSING) == [4, 5]
        assert await page.evaluate(row_cells(seed.peer_id)) == ["—", "—", "—", "—"]  # no blocks
        quantized = await get_blocks(http, b)
        assert quantized["quant"] == "int8"
        await wait_row(page, b.node.peer_id, expected_cells(quantized), max_refreshes=3)
        bars = await page.evaluate(
            "[...document.querySelectorAll('[data-testid=coverage-bar]')]"
            ".map(e => [e.dataset.peerId, +e.dataset.startBlock, +e.dataset.endBlock, e.dataset.state])"
        )
        assert sorted(bars) == sorted(
            [[a.node.peer_id, 0, 2, "online"], [b.node.peer_id, 2, 4, "online"]]
        )
        summary = "document.querySelector('[data-testid=coverage-summary]').textContent"
        assert await page.evaluate(summary) == f"{model} · {NUM_BLOCKS} blocks · 2 missing: 4–5"
        join = await page.evaluate(
            "document.querySelector('[data-testid=join-command]').textContent"
        )
        assert join == f"drift up {model} --join drift://{seed.peer_id}@{seed.addrs[0][7:]}?tls=off"
        assert await page.evaluate("document.body.dataset.state") == "ok"
        await page.screenshot(tmp_path / "dashboard_missing.png")

        await page.evaluate("window.__noReload = true")
        c = await swarm.add_server(4, 6)
        await page.wait_for(f"{ROWS}.length === 4 && {MISSING}.length === 0", timeout=30)
        assert await page.evaluate("window.__noReload === true"), "the page reloaded"
        assert (await rows(page))[c.node.peer_id] == "[4, 6)"
        assert await page.evaluate(summary) == f"{model} · {NUM_BLOCKS} blocks · complete"

        # a's row shows its real /blocks; an inference session shows up, then goes away
        idle = await get_blocks(http, a)
        assert idle["active_sessions"] == 0 and idle["dtype"] == "float32"
        await wait_row(page, a.node.peer_id, expected_cells(idle), max_refreshes=3)
        session = await RawSession.open(http, a.url, model, 0, 2, max_length=64)
        assert isinstance(session, RawSession), session
        busy = await get_blocks(http, a)
        assert busy["active_sessions"] == 1
        assert busy["cache_tokens_left"] == idle["cache_tokens_left"] - 64
        await wait_row(page, a.node.peer_id, expected_cells(busy), max_refreshes=5)
        await page.screenshot(tmp_path / "dashboard.png")
        if os.environ.get("DRIFT_DASHBOARD_PNG"):
            shutil.copyfile(tmp_path / "dashboard.png", os.environ["DRIFT_DASHBOARD_PNG"])
        await session.close()
        await wait_row(page, a.node.peer_id, expected_cells(idle), max_refreshes=5)
        assert (await get_blocks(http, a))["active_sessions"] == 0

        await wait_all_see(swarm, 4)
        await page.navigate(swarm.url(b.node))  # a non-seed node serves the same swarm
        await page.wait_for(f"{ROWS}.length === 4 && document.body.dataset.state === 'ok'")
        assert set(await rows(page)) == {n.peer_id for n in swarm.nodes}
        assert await page.evaluate(MISSING) == []
        info = await page.evaluate("document.querySelector('[data-testid=node-info]').textContent")
        assert info.endswith(f"serves {model} [2, 4)"), info

        await page.set_viewport(390, 844, mobile=True)  # phone-sized: still renders, no overflow
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 400, f"page is {width}px wide on a 390px screen"
        hidden_spans = await page.evaluate(  # each server's span is on screen, not scrolled off
            f"{ROWS}.map(r => r.querySelector('[data-testid=span]').getBoundingClientRect())"
            ".filter(b => b.width === 0 || b.right > window.innerWidth).length"
        )
        assert hidden_spans == 0, "spans are cut off on a 390px screen"
        await page.screenshot(tmp_path / "dashboard_phone.png")


@pytest.mark.timeout(120)
async def test_dashboard_reports_unreachable_node(swarms: Callable[..., Swarm]) -> None:
    swarm = swarms()
    seed = await swarm.add_seed()
    async with Browser.start() as page:
        await page.navigate(swarm.url(seed))
        await page.wait_for(f"{ROWS}.length === 1")
        await swarm.close()
        status = await page.wait_for(
            "document.body.dataset.state === 'unreachable' && "
            "document.querySelector('[data-testid=status]').textContent"
        )
        assert status.startswith("node unreachable")
        assert await page.evaluate(f"{ROWS}.length") == 1  # the last snapshot stays on screen


@pytest.mark.timeout(180)
async def test_private_swarm_asks_for_key(swarms: Callable[..., Swarm], tiny_llama6: Path) -> None:
    swarm = swarms(tiny_llama6, swarm_key="s3cret-key")
    heard: list[dict[str, str]] = []
    seed = await swarm.add_seed(spy=heard)
    await swarm.add_server(0, NUM_BLOCKS)
    await wait_all_see(swarm, 2)
    async with Browser.start() as page:
        await page.navigate(swarm.url(seed))
        await page.wait_for("document.body.dataset.state === 'auth'")
        assert await page.evaluate(f"{ROWS}.length") == 0
        assert await page.evaluate("!document.querySelector('[data-testid=key-form]').hidden")
        await page.navigate(swarm.url(seed) + "#key=wrong")
        await page.wait_for(
            "document.querySelector('[data-testid=status]').textContent.includes('refused')"
        )
        assert await page.evaluate(f"{ROWS}.length") == 0
        await page.evaluate("sessionStorage.clear()")
        await page.navigate(swarm.url(seed) + "#key=s3cret-key")
        await page.wait_for(f"{ROWS}.length === 2 && document.body.dataset.state === 'ok'")
        assert await page.evaluate("document.querySelector('[data-testid=key-form]').hidden")
        assert await page.evaluate(MISSING) == []
    # the page proved the key with an HMAC; the key itself never reached the node
    assert any("X-Drift-Auth" in h for h in heard)
    assert not any("s3cret-key" in json.dumps(h) or "Authorization" in h for h in heard)
