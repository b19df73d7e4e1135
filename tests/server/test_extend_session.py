"""A session grown in place (`extend` on its socket) keeps its cache: the steps after it
give the full model's logits with nothing replayed; its extra cache room is reserved and
given back at close; a refusal (past the server's limit, no room, no session) is named and
leaves the session as it was."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import torch

from drift import PROTOCOL_VERSION
from drift.wire.extend import ExtendSession
from tests.server.reference import head_logits, load_reference
from tests.server.wsclient import RawSession


async def _extend(session: RawSession, max_length: int) -> dict:
    await session.ws.send_str(orjson.dumps(ExtendSession(max_length).to_wire()).decode())
    msg = await session.ws.receive()
    assert msg.type == aiohttp.WSMsgType.TEXT, msg.type
    return orjson.loads(msg.data)


async def test_extend_keeps_the_cache_and_reserves_the_room(servers, tiny_llama):
    a = await servers(tiny_llama, 0, 2, inference_max_length=64, attn_cache_tokens=100)
    b = await servers(tiny_llama, 2, 4, inference_max_length=64, attn_cache_tokens=100)
    ref = load_reference(tiny_llama)
    fp = a.server.backend.fingerprint
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    embed = ref.model.embed_tokens
    async with aiohttp.ClientSession() as http:
        sessions = [await RawSession.open(http, a.url, fp, 0, 2, max_length=8),
                    await RawSession.open(http, b.url, fp, 2, 4, max_length=8)]  # fmt: skip
        with torch.no_grad():
            hidden = embed(ids)
            for s in sessions:
                hidden = await s.step(hidden, 0)
            full = await sessions[0].step_error(embed(ids[:, :1]), 8)
            assert full["code"] == "length_exceeded"
            for s, server in zip(sessions, (a, b), strict=True):
                assert server.server.sessions.budget.tokens_left == 100 - 8
                reply = await _extend(s, 40)
                assert reply["type"] == "session_extended" and reply["max_length"] == 40
                assert server.server.sessions.budget.tokens_left == 100 - 40
                assert (await _extend(s, 20))["max_length"] == 40  # not shorter: no change
            for _ in range(12):  # past the first 8 tokens, on the same caches
                nxt = head_logits(ref, hidden)[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
                hidden = embed(nxt)
                for s in sessions:
                    hidden = await s.step(hidden, ids.shape[1] - 1)
            want = ref(ids).logits[:, -1:]
        assert torch.allclose(head_logits(ref, hidden), want, atol=1e-4, rtol=1e-4)
        assert [s.server.metrics.tokens_total for s in (a, b)] == [20, 20]  # each once
        for s in sessions:
            await s.close()
    for server in (a, b):
        assert await _eventually_free(server)


async def _eventually_free(server, tries: int = 100) -> bool:
    for _ in range(tries):
        if server.server.sessions.budget.used == 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_refusals_are_named_and_change_nothing(servers, tiny_llama):
    # one client here fills the budget on purpose (its share is tests/server/test_kv_share.py's)
    a = await servers(tiny_llama, 0, 2, inference_max_length=32, attn_cache_tokens=40,
                      client_cache_share=1.0)  # fmt: skip
    fp = a.server.backend.fingerprint
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{a.url}/inference")
        await ws.send_str(orjson.dumps(ExtendSession(16).to_wire()).decode())
        err = orjson.loads((await ws.receive()).data)
        assert err["code"] == "bad_request" and "send 'open' first" in err["message"]
        await ws.send_str(orjson.dumps({"type": "extend", "version": PROTOCOL_VERSION}).decode())
        err = orjson.loads((await ws.receive()).data)
        assert err["code"] == "bad_request" and "'max_length'" in err["message"]
        await ws.close()
        first = await RawSession.open(http, a.url, fp, 0, 2, max_length=8)
        other = await RawSession.open(http, a.url, fp, 0, 2, max_length=10)  # 18 of 40 held
        err = await _extend(first, 33)
        assert err["code"] == "length_exceeded" and "limit of 32" in err["message"]
        err = await _extend(first, 32)  # 24 more per block: 22 left
        assert err["code"] == "cache_full", err
        assert a.server.sessions.budget.tokens_left == 40 - 18
        hidden = torch.randn(1, 8, 64)
        await first.step(hidden, 0)  # still 8 long, still works
        assert (await first.step_error(hidden[:, :1], 8))["code"] == "length_exceeded"
        assert (await _extend(first, 24))["max_length"] == 24
        await first.step(hidden[:, :1], 8)
        await first.close()
        await other.close()
