"""`drift api` over a real loopback swarm (block servers from tests/server/harness.py):
greedy answers equal local transformers, concurrent requests hold separate sessions, a
stream closed early frees the servers' caches (GET /blocks), missing blocks are a 503."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
import torch

from drift.api.app import ApiConfig, build_api_app
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, chat_ids, reference

pytestmark = pytest.mark.timeout(180)


async def _api_over(swarms, sdk_models, web_apps, model_dir, local_model, spans) -> tuple:
    """A swarm over `spans`, the SDK model on it and a `drift api` app in front: (swarm,
    openai client, url); the fixtures stop all three."""
    swarm = await swarms.start(model_dir, spans)
    model = await sdk_models.open(model_dir, swarm.token)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
    config = ApiConfig(api_keys=(API_KEY,), service=ServiceConfig(max_concurrent=2))
    url = await web_apps.start(build_api_app(engine, config))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    return swarm, client, url


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


async def test_api_over_swarm(model_dir, local_model, swarms, sdk_models, web_apps) -> None:
    prompt = chat_ids(local_model)
    text, n_tokens, _ = reference(local_model, prompt, 16)
    comp_text, _, _ = reference(local_model, local_model[1]("Once upon")["input_ids"], 16)
    swarm, client, url = await _api_over(swarms, sdk_models, web_apps, model_dir, local_model,
                                         [(0, 2), (2, 4)])  # fmt: skip
    async with client:
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


async def test_missing_blocks_is_503(model_dir, local_model, swarms, sdk_models,
                                     web_apps) -> None:  # fmt: skip
    _, client, _ = await _api_over(swarms, sdk_models, web_apps, model_dir, local_model, [(0, 2)])
    async with client:
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
