"""Held prefix sessions shrink the servers' free KV room; the next request's chain must still
be one hop per server (main's routing cut each server's span into one-block hops once the
room left was under two sessions' worth: drift_route listed four spans for two servers)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from drift.api.app import ApiConfig, build_api_app
from drift.api.prefix import SessionPool
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, reference

pytestmark = pytest.mark.timeout(180)

HEADROOM = 512  # swarm_engine's default: pooled sessions open this much longer
MAX_TOKENS = 12


def _ids(local_model, messages) -> list[int]:
    tokenizer = local_model[1]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


async def _room_seen(model, expected: int) -> None:
    """Until the client's table shows every server with `expected` tokens of room left."""
    client = model.client
    for _ in range(100):
        await asyncio.to_thread(client.run, client.swarm.refresh(force=True))
        servers = client.swarm.servers(client.model_fingerprint)
        if servers and all(s.cache_tokens_left == expected for s in servers):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"room never announced as {expected}: {servers}")


async def test_held_session_does_not_split_the_chain(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    other = [{"role": "system", "content": "BE BRIEF."}, {"role": "user", "content": "HI THERE"}]
    need = len(_ids(local_model, MESSAGES)) + MAX_TOKENS + HEADROOM  # tokens per session
    assert len(_ids(local_model, other)) + MAX_TOKENS + HEADROOM == need
    room = 2 * need + need // 2  # after one held session: 1.5 sessions' worth per block
    # the api is one client holding 2 of 2.5 sessions' room here: past the default share
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], attn_cache_tokens=room,
                               client_cache_share=1.0)  # fmt: skip
    model = await sdk_models.open(model_dir, swarm.token)
    pool = SessionPool(model, max_sessions=4)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID, pool=pool)
    service = ServiceConfig(max_concurrent=2, max_batch=8)
    url = await web_apps.start(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    servers = [(s.node.peer_id, *span) for s, span in zip(swarm.servers, [(0, 2), (2, 4)],
                                                          strict=True)]  # fmt: skip

    async def chat(messages) -> list[tuple]:
        resp = await client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        want = reference(local_model, _ids(local_model, messages), MAX_TOKENS)[0]
        assert resp.choices[0].message.content == want
        return [(r["peer_id"], r["start_block"], r["end_block"])
                for r in resp.model_extra["drift_route"]]  # fmt: skip

    async with client:
        assert await chat(MESSAGES) == servers
        assert len(pool) == 1  # held: its KV stays reserved on both servers
        await _room_seen(model, room - need)
        assert await chat(other) == servers  # main: four one-block hops
        assert len(pool) == 2
