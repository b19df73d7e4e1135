"""The dashboard's live load in a real headless Chromium against a real swarm under load.

A seed and two real block servers ([0, 3) and [3, 6) of a 6-block tiny llama) on loopback;
inference sessions step through both servers while the page is open. The page must chart,
for each server, steps/s, tokens/s, sessions and cache use (kept in the page from its /swarm
polls), the swarm's total tokens/s (a token through the whole model counted once: each
server's tokens/s times its share of the blocks), and this node's measured latency to each
peer; when the load stops, the charts fall back to zero without a reload. Skipped when
/usr/bin/chromium is absent. DRIFT_DASHBOARD_PNG=<path> writes the screenshot there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import aiohttp
import pytest
import torch

from tests.web.cdp import CHROMIUM, Browser

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (scripts/ci_system_deps.sh)",
                allow_module_level=True)  # fmt: skip

from tests.server.harness import RunningServer  # noqa: E402
from tests.server.wsclient import RawSession  # noqa: E402
from tests.web import node_swarms  # noqa: E402
from tests.web.node_swarms import ROWS, Swarm, wait_all_see  # noqa: E402

# the swarm fixtures (a helper module's, not another test module's)
swarm, swarms, tiny_llama6 = node_swarms.swarm, node_swarms.swarms, node_swarms.tiny_llama6

NUM_BLOCKS = 6


def chart(metric: str, peer_id: str | None = None) -> str:
    """JS: the chart element of `metric` (for `peer_id`, or the swarm total)."""
    peer = f'[data-peer-id="{peer_id}"]' if peer_id else ""
    return f"document.querySelector('[data-testid=load-chart][data-metric={metric}]{peer}')"


def last(metric: str, peer_id: str | None = None) -> str:
    return f"(c => c && c.dataset.last !== '' ? +c.dataset.last : null)({chart(metric, peer_id)})"


async def keep_busy(http: aiohttp.ClientSession, server: RunningServer, stop: asyncio.Event) -> int:
    """Inference sessions on `server`'s span, one step after another, until `stop`; #steps."""
    b = server.server.backend
    steps = 0
    while not stop.is_set():
        session = await RawSession.open(http, server.url, b.model_name, b.start_block,
                                        b.end_block, max_length=32, batch_size=2)  # fmt: skip
        assert isinstance(session, RawSession), session
        try:
            for pos in range(0, 32, 4):
                if stop.is_set():
                    break
                await session.step(torch.randn(2, 4, b.hidden_size), pos)
                steps += 1
                await asyncio.sleep(0.05)
        finally:
            await session.close()
    return steps


@pytest.mark.timeout(240)
async def test_dashboard_charts_live_load(swarm: Swarm, tmp_path: Path) -> None:  # noqa: F811
    seed = await swarm.add_seed()
    a = await swarm.add_server(0, 3)
    b = await swarm.add_server(3, NUM_BLOCKS)
    await wait_all_see(swarm, 3)
    servers = {a.node.peer_id: a, b.node.peer_id: b}

    async with Browser.start() as page, aiohttp.ClientSession() as http:
        await page.set_viewport(1280, 1400)
        await page.set_color_scheme("light")
        await page.navigate(swarm.url(seed))
        await page.wait_for(f"{ROWS}.length === 3")
        # one card per server (the seed serves no blocks), four charts each, and the total
        cards = await page.evaluate(
            "[...document.querySelectorAll('[data-testid=load-server]')].map(c => "
            "[c.dataset.peerId, [...c.querySelectorAll('[data-testid=load-chart]')]"
            ".map(f => f.dataset.metric)])"
        )
        assert sorted(cards) == sorted(
            [[p, ["steps", "tokens", "sessions", "cache"]] for p in servers]
        )
        assert await page.evaluate(f"{chart('total-tokens')} !== null")

        stop = asyncio.Event()
        load = [asyncio.create_task(keep_busy(http, s, stop)) for s in (a, b)]
        try:
            busy = " && ".join(
                f"{last('tokens', p)} > 0 && {last('steps', p)} > 0 && {last('sessions', p)} >= 1"
                f" && {last('cache', p)} > 0"
                for p in servers
            )
            await page.wait_for(f"{busy} && {last('total-tokens')} > 0", timeout=60)
            # the total is each server's tokens/s times the share of the model's blocks they
            # ran through (here each step runs a server's whole span: 3 of 6 blocks; charts
            # drawn from one poll), and each chart keeps the samples of every poll
            total, per_server = await page.evaluate(
                f"[{last('total-tokens')}, [{', '.join(last('tokens', p) for p in servers)}]]"
            )
            assert total == pytest.approx(sum(v * 3 / NUM_BLOCKS for v in per_server), rel=1e-3)
            points = await page.evaluate(f"+{chart('tokens', a.node.peer_id)}.dataset.points")
            assert points >= 2
            # the seed gossips with both servers and shows its round trip to each
            latency = await page.wait_for(
                f"(() => {{ const v = {ROWS}.filter(r => r.dataset.peerId !== '{seed.peer_id}')"
                ".map(r => r.querySelector('[data-testid=latency]').textContent);"
                " return v.every(t => / ms$/.test(t)) && v; })()"
            )
            assert len(latency) == 2 and all(float(t.split()[0]) > 0 for t in latency)
            await page.screenshot(tmp_path / "dashboard_load.png")
            if os.environ.get("DRIFT_DASHBOARD_PNG"):
                shutil.copyfile(tmp_path / "dashboard_load.png", os.environ["DRIFT_DASHBOARD_PNG"])
        finally:
            stop.set()
            steps = await asyncio.gather(*load)
        assert all(n > 0 for n in steps)

        await page.evaluate("window.__noReload = true")
        idle = " && ".join(f"{last('tokens', p)} === 0 && {last('sessions', p)} === 0"
                           for p in servers)  # fmt: skip
        await page.wait_for(f"{idle} && {last('total-tokens')} === 0", timeout=60)
        assert await page.evaluate("window.__noReload === true"), "the page reloaded"
        peaks = await page.evaluate(f"+{chart('tokens', a.node.peer_id)}.dataset.max")
        assert peaks > 0, "the busy minutes stay in the chart's history"
        assert not [m for m in page.console if "error" in m.lower()], page.console


async def test_history_keeps_ten_minutes() -> None:
    """LoadHistory (web/history.js) drops samples older than its window: run in Chromium."""
    async with Browser.start() as page:
        await page.navigate("about:blank")
        history_js = (Path(__file__).resolve().parents[2] / "web" / "history.js").read_text()
        module = history_js.replace("export ", "")
        result = await page.evaluate(
            "(() => {" + module + "\n"
            "const h = new LoadHistory(600);"
            "const rec = (tps) => ({peer_id: 'p', role: 'server', state: 'online', num_blocks: 4,"
            " start_block: 0, end_block: 2, tokens_per_s: tps, block_tokens_per_s: 2 * tps,"
            " steps_per_s: 1,"
            " active_sessions: 1, cache_tokens_total: 100, cache_tokens_left: 25});"
            "for (let t = 0; t <= 900; t += 100) h.add({fetchedAt: t, swarm: {records: [rec(t)],"
            " latency_ms: {p: 5}}});"
            "return [h.series('p', 'tokens').map(p => p[0]), h.totalSeries().at(-1),"
            " h.series('p', 'cache').at(-1)[1], h.latestLatency('p')];"
            "})()"
        )
    times, total, cache, latency = result
    assert times == [300, 400, 500, 600, 700, 800, 900]
    assert total == [900, 450]  # 900 tokens/s through half of the blocks
    assert cache == 0.75 and latency == 5
