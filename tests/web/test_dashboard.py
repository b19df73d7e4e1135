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

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from tests.web.cdp import CHROMIUM, Browser

if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} not found: install Debian's chromium (scripts/ci_system_deps.sh)",
        allow_module_level=True,
    )
from tests.server.harness import RunningServer  # noqa: E402
from tests.server.wsclient import RawSession  # noqa: E402
from tests.web import node_swarms  # noqa: E402
from tests.web.node_swarms import MISSING, NUM_BLOCKS, REFRESHES, ROWS, Swarm, wait_all_see  # noqa: E402

# the swarm fixtures (a helper module's, not another test module's)
swarm, swarms, tiny_llama6 = node_swarms.swarm, node_swarms.swarms, node_swarms.tiny_llama6


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

        # a draining server (a graceful stop handing its sessions over) says so, row and bar,
        # on a node that learnt it by gossip
        c.node.announce(draining=1)
        row = f'[data-testid=server-row][data-peer-id="{c.node.peer_id}"]'
        state = f"document.querySelector('{row} [data-testid=state]').textContent"
        await page.wait_for(f"{state} === 'online · draining'", timeout=30)
        bar = f'[data-testid=coverage-bar][data-peer-id="{c.node.peer_id}"]'
        assert await page.evaluate(
            f"document.querySelector('{bar}').classList.contains('draining')"
        )
        assert await page.evaluate(
            f"document.querySelector('{row}').classList.contains('draining')"
        )

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
