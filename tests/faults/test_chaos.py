"""Chaos, short form: attacks mixed with normal generation on a real loopback swarm.

While a client generates, an attacker floods gossip with forged records, sends bodies past
the limit, pushes steps for sessions that are not there and hogs the KV cache from one
address. At the end every server still serves, greedy tokens equal local transformers and
the test process's RSS stayed bounded. `DRIFT_CHAOS_ROUNDS` (default 3) makes it longer.
"""

from __future__ import annotations

import asyncio
import os
import resource

import aiohttp
import orjson
import pytest
import torch

from drift.wire.frames import encode_frame
from tests.server.reference import load_reference
from tests.server.wsclient import RawSession
from tests.tiny_models import TinyDirs

ROUNDS = int(os.environ.get("DRIFT_CHAOS_ROUNDS", "3"))  # the long form: e.g. 50


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> TinyDirs:
    return TinyDirs(tmp_path_factory.mktemp("tiny_chaos"))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _attack(http: aiohttp.ClientSession, url: str, fp: str) -> dict[str, int]:
    """One round of every attack; the statuses seen, by attack."""
    seen: dict[str, int] = {}
    forged = [{"peer_id": f"12D3KooWforged{i}", "seq": i, "signature": "x"} for i in range(300)]
    async with http.post(f"{url}/swarm/gossip", data=orjson.dumps({"records": forged}),
                         headers={"Content-Type": "application/json"}) as r:  # fmt: skip
        seen["gossip_flood"] = r.status
    async with http.post(f"{url}/forward", data=b"\0" * (2 << 20),
                         headers={"Content-Type": "application/json"}) as r:  # fmt: skip
        seen["huge_body"] = r.status
    ws = await http.ws_connect(f"{url}/push")
    await ws.send_bytes(encode_frame({"session_id": "00" * 8, "step_id": 1, "position": 0},
                                     {"hidden_states": torch.zeros(1, 1, 64)}))  # fmt: skip
    reply = await ws.receive(timeout=10)
    seen["bad_push"] = int("push_forbidden" in str(reply.data))
    await ws.close()
    hogs = [await RawSession.open(http, url, fp, 0, 4, max_length=64) for _ in range(4)]
    seen["kv_hog_refused"] = sum(1 for h in hogs if isinstance(h, dict))
    for h in hogs:
        if isinstance(h, RawSession):
            await h.ws.close()
    return seen


async def test_chaos_short(tiny_dirs, swarms, sdk_models) -> None:
    model_dir = tiny_dirs("llama")
    ids = torch.tensor([[5, 3, 5, 8, 9]])
    ref = load_reference(model_dir).generate(ids, max_new_tokens=6, do_sample=False)
    swarm = await swarms.start(model_dir, [(0, 4), (0, 4)], max_body_bytes=1 << 20,
                               attn_cache_tokens=128)  # fmt: skip
    model = await sdk_models.open(model_dir, swarm.token)
    fp = swarm.seed.server.backend.fingerprint
    rss0 = None
    async with aiohttp.ClientSession() as http:
        for round_ in range(ROUNDS):
            gen = asyncio.create_task(asyncio.to_thread(
                model.generate, ids, max_new_tokens=6, do_sample=False))  # fmt: skip
            for s in swarm.servers:
                seen = await _attack(http, s.url, fp)
                assert seen["gossip_flood"] < 500 and 400 <= seen["huge_body"] < 500, seen
                assert seen["bad_push"] == 1 and seen["kv_hog_refused"] >= 1, seen
            assert torch.equal(await gen, ref)
            rss0 = _rss_mib() if round_ == 0 else rss0
        for s in swarm.servers:
            async with http.get(f"{s.url}/health") as r:
                assert r.status == 200
            assert not s.node.record.degraded
    assert torch.equal(await asyncio.to_thread(model.generate, ids, max_new_tokens=6,
                                               do_sample=False), ref)  # fmt: skip
    assert rss0 is not None and _rss_mib() - rss0 < 200, (rss0, _rss_mib())
