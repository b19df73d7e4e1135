"""The dashboard in a real headless Chromium against a real swarm of nodes on loopback.

Three nodes (a seed and two servers announcing spans of a 30-block model, blocks 20-29
uncovered) gossip over HTTP; the page served by the seed must list every server with its
span and mark the missing blocks; a fourth server covering them must clear the marks
without a reload; a non-seed node's page shows the same swarm; a private swarm asks for
its key. Skipped when /usr/bin/chromium is absent (scripts/ci_system_deps.sh installs it).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from drift.identity import Identity
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
except ImportError as exc:  # pragma: no cover - until drift/node's app lands
    pytest.skip(f"drift.node app not built yet: {exc}", allow_module_level=True)

MODEL = "SmolLM2-135M-Instruct"
FINGERPRINT = "5f1c0a9e" * 8
NUM_BLOCKS = 30
ROWS = "[...document.querySelectorAll('[data-testid=server-row]')]"
MISSING = "[...document.querySelectorAll('[data-missing=true]')].map(e => +e.dataset.block)"


class Swarm:
    """Nodes on 127.0.0.1 started in-process; all stopped by `close`."""

    def __init__(self, swarm_key: str | None = None) -> None:
        self.swarm_key = swarm_key
        self.runners: list[RunningApp] = []
        self.nodes: list[MembershipNode] = []

    async def add(self, *, span: tuple[int, int] | None = None) -> MembershipNode:
        seeds = (self.nodes[0].join_token(),) if self.nodes else ()
        config = NodeConfig(
            host="127.0.0.1",
            port=0,
            initial_peers=seeds,
            swarm_key=self.swarm_key,
            gossip_interval_s=0.3,
            request_timeout_s=2.0,
        )
        node = MembershipNode(Identity.generate(), config)
        if span is not None:
            node.announce(
                role="server", model=MODEL, model_fingerprint=FINGERPRINT,
                num_blocks=NUM_BLOCKS, start_block=span[0], end_block=span[1],
                dtype="float32", quant="none", throughput=50.0 + span[0],
                cache_tokens_total=8192, cache_tokens_left=8192 - 512 * len(self.nodes),
                active_sessions=len(self.nodes) % 3,
            )  # fmt: skip
        self.runners.append(await start_app(build_node_app(node), "127.0.0.1", 0))
        self.nodes.append(node)
        return node

    def url(self, node: MembershipNode) -> str:
        return node.addrs[0].rstrip("/") + "/"

    async def close(self) -> None:
        for runner in reversed(self.runners):
            await runner.stop()


@pytest.fixture
async def swarm() -> AsyncIterator[Swarm]:
    s = Swarm()
    try:
        yield s
    finally:
        await s.close()


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


@pytest.mark.timeout(180)
async def test_dashboard_shows_swarm_and_follows_coverage(swarm: Swarm, tmp_path: Path) -> None:
    seed = await swarm.add()
    a = await swarm.add(span=(0, 12))
    b = await swarm.add(span=(12, 20))
    await wait_all_see(swarm, 3)

    async with Browser.start() as page:
        await page.set_viewport(1280, 900)
        await page.navigate(swarm.url(seed))
        await page.wait_for(f"{ROWS}.length === 3 && {MISSING}.length === 10")
        assert await rows(page) == {seed.peer_id: "—", a.peer_id: "[0, 12)", b.peer_id: "[12, 20)"}
        assert await page.evaluate(MISSING) == list(range(20, 30))
        bars = await page.evaluate(
            "[...document.querySelectorAll('[data-testid=coverage-bar]')]"
            ".map(e => [e.dataset.peerId, +e.dataset.startBlock, +e.dataset.endBlock, e.dataset.state])"
        )
        assert sorted(bars) == sorted([[a.peer_id, 0, 12, "online"], [b.peer_id, 12, 20, "online"]])
        join = await page.evaluate(
            "document.querySelector('[data-testid=join-command]').textContent"
        )
        assert join == f"drift up {MODEL} --join drift://{seed.peer_id}@{seed.addrs[0][7:]}"
        assert await page.evaluate("document.body.dataset.state") == "ok"
        await page.screenshot(tmp_path / "dashboard_missing.png")

        await page.evaluate("window.__noReload = true")
        c = await swarm.add(span=(18, 30))
        await page.wait_for(f"{ROWS}.length === 4 && {MISSING}.length === 0", timeout=30)
        assert await page.evaluate("window.__noReload === true"), "the page reloaded"
        assert (await rows(page))[c.peer_id] == "[18, 30)"
        assert (
            await page.evaluate(
                "document.querySelector('[data-testid=coverage-summary]').textContent"
            )
            == f"{MODEL} · {NUM_BLOCKS} blocks · complete"
        )
        await page.screenshot(tmp_path / "dashboard.png")

        await wait_all_see(swarm, 4)
        await page.navigate(swarm.url(b))  # a non-seed node serves the same swarm
        await page.wait_for(f"{ROWS}.length === 4 && document.body.dataset.state === 'ok'")
        assert set(await rows(page)) == {n.peer_id for n in swarm.nodes}
        assert await page.evaluate(MISSING) == []

        await page.set_viewport(390, 844, mobile=True)  # phone-sized: still renders, no overflow
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 400, f"page is {width}px wide on a 390px screen"
        await page.screenshot(tmp_path / "dashboard_phone.png")


@pytest.mark.timeout(120)
async def test_dashboard_reports_unreachable_node(swarm: Swarm) -> None:
    seed = await swarm.add()
    async with Browser.start() as page:
        await page.navigate(swarm.url(seed))
        await page.wait_for(f"{ROWS}.length === 1")
        await swarm.close()
        swarm.runners.clear()
        status = await page.wait_for(
            "document.body.dataset.state === 'unreachable' && "
            "document.querySelector('[data-testid=status]').textContent"
        )
        assert status.startswith("node unreachable")
        assert await page.evaluate(f"{ROWS}.length") == 1  # the last snapshot stays on screen


@pytest.mark.timeout(120)
async def test_private_swarm_asks_for_key() -> None:
    swarm = Swarm(swarm_key="s3cret-key")
    try:
        seed = await swarm.add()
        await swarm.add(span=(0, 30))
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
    finally:
        await swarm.close()
