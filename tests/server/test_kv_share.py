"""Fair KV share: one client (by address) cannot hold the whole KV budget of a server.

Beyond its first session a client holds at most `client_cache_share` of the budget (default
0.5); more is a retryable `cache_full` naming the limit, and another client still gets room.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import torch

from drift.server.config import ServerConfig
from tests.server.wsclient import RawSession

H = 64


def _client(addr: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(addr, 0)))


async def test_one_client_cannot_hold_the_whole_budget(servers, tiny_llama) -> None:
    assert ServerConfig(model="x").client_cache_share == 0.5  # the default is what is tested
    running = await servers(tiny_llama, 0, 2)  # 8,192 tokens per block, sessions of 2,048
    fp = running.server.backend.fingerprint
    async with _client("127.0.0.1") as hog, _client("127.0.0.2") as other:
        held = [await RawSession.open(hog, running.url, fp, 0, 2, max_length=2048)
                for _ in range(2)]  # fmt: skip
        assert all(isinstance(s, RawSession) for s in held), held
        err = await RawSession.open(hog, running.url, fp, 0, 2, max_length=2048)
        assert err["type"] == "error" and err["code"] == "cache_full", err
        assert "client_cache_share=0.5" in err["message"], err
        # the refused session changed nothing; another client still gets a session and steps
        assert running.server.sessions.budget.used == 2 * 2048 * 2
        mine = await RawSession.open(other, running.url, fp, 0, 2, max_length=2048)
        assert isinstance(mine, RawSession), mine
        x = torch.randn(1, 4, H)
        out = await mine.step(x, 0)
        assert torch.allclose(out, running.server.backend.span.forward(x), atol=1e-5)
        # closing one of the hog's sessions gives it its share back
        await held[0].ws.close()
        for _ in range(100):
            if running.server.sessions.budget.used == 2 * 2048 * 2:
                break
            await asyncio.sleep(0.02)
        again = await RawSession.open(hog, running.url, fp, 0, 2, max_length=2048)
        assert isinstance(again, RawSession), again


async def test_a_first_session_may_use_the_whole_budget(servers, tiny_llama) -> None:
    """A lone session (a long context) is bounded by the budget, not by the share."""
    running = await servers(tiny_llama, 0, 2, attn_cache_tokens=300, inference_max_length=300)
    fp = running.server.backend.fingerprint
    async with _client("127.0.0.1") as http:
        first = await RawSession.open(http, running.url, fp, 0, 2, max_length=280)
        assert isinstance(first, RawSession), first
        second = await RawSession.open(http, running.url, fp, 0, 2, max_length=10)
        assert second["code"] == "cache_full" and "client_cache_share" in second["message"]


async def test_clients_that_prove_the_swarm_key_are_not_limited(servers, tiny_llama) -> None:
    """A private swarm's own clients (they prove the swarm key, e.g. a `drift api` serving many
    users from one address) hold what the budget allows; the share is for anonymous ones."""
    from drift.wire import messages as m
    from drift.wire.auth import auth_headers

    key = "k3y-of-the-swarm"
    running = await servers(tiny_llama, 0, 2, swarm_key=key)
    fp = running.server.backend.fingerprint
    sockets = []
    async with aiohttp.ClientSession() as http:
        for _ in range(3):  # 3 x 2,048 of 8,192 tokens: past a share of 0.5
            headers = auth_headers(key, "GET", "/inference", peer_id=running.node.peer_id)
            ws = await http.ws_connect(f"{running.url}/inference", headers=headers)
            sockets.append(ws)
            opened = m.OpenSession(fp, 0, 2, 2048, 1, "float32").to_wire()
            await ws.send_str(orjson.dumps(opened).decode())
            reply = orjson.loads((await ws.receive()).data)
            assert reply["type"] == "session_opened", reply
        assert running.server.sessions.budget.used == 3 * 2048 * 2
        for ws in sockets:
            await ws.close()
