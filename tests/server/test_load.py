"""Load: 16 concurrent inference sessions plus a stream of forwards for 30 s on loopback.

No errors, no leaked cache tokens (shown by /blocks), resident memory flat.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import torch

from drift.wire import messages as m
from tests.server.wsclient import RawSession

DURATION_S = 30.0


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
async def test_sessions_and_forwards_under_load(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 4, attn_cache_tokens=4096, inference_max_length=256)
    fp = running.server.backend.fingerprint
    stop_at = time.monotonic() + DURATION_S
    counts = {"steps": 0, "forwards": 0, "sessions": 0}
    rss: list[float] = []

    async def session_worker(http):
        while time.monotonic() < stop_at:
            sess = await RawSession.open(http, running.url, fp, 0, 4, max_length=64)
            assert isinstance(sess, RawSession), sess
            counts["sessions"] += 1
            out = await sess.step(torch.randn(1, 8, 64), 0)
            assert out.shape == (1, 8, 64)
            for pos in range(8, 64):
                if time.monotonic() >= stop_at:
                    break
                await sess.step(torch.randn(1, 1, 64), pos)
                counts["steps"] += 1
            await sess.close()

    async def forward_worker(http):
        while time.monotonic() < stop_at:
            body = m.encode(m.ForwardRequest(fp, 1, 3, torch.randn(2, 16, 64)))
            async with http.post(f"{running.url}/forward", data=body) as resp:
                assert resp.status == 200, await resp.text()
                m.decode(m.ForwardResponse, await resp.read())
            counts["forwards"] += 1

    async def sampler():
        while time.monotonic() < stop_at:
            rss.append(_rss_mb())
            await asyncio.sleep(1.0)

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(session_worker(http) for _ in range(16)),
                             forward_worker(http), sampler())  # fmt: skip
        await asyncio.sleep(0.3)  # closes reach the server
        async with http.get(f"{running.url}/blocks") as resp:
            info = await resp.json()
    assert info["active_sessions"] == 0
    assert info["cache_block_tokens_left"] == info["cache_block_tokens_total"]
    assert counts["steps"] > 100 and counts["forwards"] > 10 and counts["sessions"] >= 16
    warm = rss[len(rss) // 3 :]
    assert max(warm) - warm[0] < 64, f"RSS grew: {warm}"
    print(counts, f"rss {warm[0]:.0f} -> {warm[-1]:.0f} MB")
