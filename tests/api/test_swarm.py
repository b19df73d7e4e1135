"""`drift api` over a real loopback swarm (block servers from tests/server/harness.py):
greedy answers equal local transformers, concurrent requests hold separate sessions, a
stream closed early frees the servers' caches (GET /blocks), missing blocks are a 503."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import torch

from drift.api.app import ApiConfig, build_api_app
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from drift.client import AutoDistributedModelForCausalLM
from tests.api.conftest import API_KEY, MODEL_ID, start_app
from tests.api.test_openai import MESSAGES, chat_ids, reference
from tests.client.conftest import start_swarm, stop_swarm

pytestmark = pytest.mark.timeout(180)


@contextlib.asynccontextmanager
async def _api_over(model_dir, local_model, spans) -> AsyncIterator[tuple]:
    swarm = await start_swarm(model_dir, spans)
    model = None
    try:
        model = await asyncio.to_thread(
            AutoDistributedModelForCausalLM.from_pretrained, model_dir, initial_peers=swarm.token
        )
        engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
        config = ApiConfig(api_keys=(API_KEY,), service=ServiceConfig(max_concurrent=2))
        runner, url = await start_app(build_api_app(engine, config))
        try:
            async with openai.AsyncOpenAI(
                base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60
            ) as client:
                yield swarm, client, url
        finally:
            await runner.cleanup()
    finally:
        if model is not None:
            await asyncio.to_thread(model.close)
        await stop_swarm(swarm)


async def _blocks(swarm) -> list[dict]:
    async with aiohttp.ClientSession() as http:
        out = []
        for running in swarm.servers:
            async with http.get(f"{running.url}/blocks") as r:
                out.append(await r.json())
        return out


async def _health(url: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/health") as r:
            return await r.json()


async def test_api_over_swarm(model_dir, local_model) -> None:
    prompt = chat_ids(local_model)
    text, n_tokens, _ = reference(local_model, prompt, 16)
    comp_text, _, _ = reference(local_model, local_model[1]("Once upon")["input_ids"], 16)
    async with _api_over(model_dir, local_model, [(0, 2), (2, 4)]) as (swarm, client, url):
        resp = await client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0
        )
        assert resp.choices[0].message.content == text
        assert resp.usage.completion_tokens == n_tokens
        route = resp.model_extra["drift_route"]  # which servers ran the blocks
        assert [(r["start_block"], r["end_block"]) for r in route] == [(0, 2), (2, 4)]
        assert [r["peer_id"] for r in route] == [s.node.peer_id for s in swarm.servers]

        # embeddings through the swarm: the model's own final normed state, mean-pooled
        emb = await client.embeddings.create(model=MODEL_ID, input="Once upon")
        ids = torch.tensor([local_model[1]("Once upon")["input_ids"]])
        with torch.no_grad():
            final = local_model[0].model(ids).last_hidden_state[0]  # [T, H]
        ref = torch.nn.functional.normalize(final.mean(0), dim=-1)
        torch.testing.assert_close(torch.tensor(emb.data[0].embedding), ref, rtol=0, atol=1e-5)

        # two requests at once, each with its own sessions, both equal to local transformers
        chat, comp = await asyncio.gather(
            client.chat.completions.create(
                model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0
            ),
            client.completions.create(
                model=MODEL_ID, prompt="Once upon", max_tokens=16, temperature=0
            ),
        )
        assert chat.choices[0].message.content == text
        assert comp.choices[0].text == comp_text

        # a stream closed early frees the server-side caches
        idle = await _blocks(swarm)
        before = (await _health(url))["tokens_generated"]
        assert all(b["active_sessions"] == 0 for b in idle)
        stream = await client.completions.create(
            model=MODEL_ID, prompt="Once", max_tokens=900, temperature=0, stream=True
        )
        async for _ in stream:
            break
        busy = await _blocks(swarm)
        assert all(b["active_sessions"] == 1 for b in busy)
        assert all(
            b["cache_tokens_left"] < i["cache_tokens_left"] for b, i in zip(busy, idle, strict=True)
        )
        await stream.close()
        for _ in range(100):
            now = await _blocks(swarm)
            if all(b["active_sessions"] == 0 for b in now):
                break
            await asyncio.sleep(0.05)
        assert [b["active_sessions"] for b in now] == [0, 0]
        assert [b["cache_tokens_left"] for b in now] == [b["cache_tokens_left"] for b in idle]
        assert (await _health(url))["tokens_generated"] - before < 900  # cancelled, not finished


async def test_missing_blocks_is_503(model_dir, local_model) -> None:
    async with _api_over(model_dir, local_model, [(0, 2)]) as (_swarm, client, _url):
        with pytest.raises(openai.InternalServerError) as info:
            await client.completions.create(model=MODEL_ID, prompt="Once", max_tokens=4)
        assert info.value.status_code == 503
        assert info.value.code == "missing_blocks"
        assert info.value.response.headers["Retry-After"] == "5"
        assert "2" in info.value.message and "3" in info.value.message
        with pytest.raises(openai.InternalServerError) as info:
            await client.completions.create(
                model=MODEL_ID, prompt="Once", max_tokens=4, stream=True
            )
        assert info.value.status_code == 503
