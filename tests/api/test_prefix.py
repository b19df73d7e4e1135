"""Prefix reuse in `drift api` over a loopback swarm: the next chat turn continues the
session of the one before (only the new tokens go to the servers) and answers exactly as
local transformers does on the whole conversation; an edited history reuses the part it
shares (the servers roll back the rest); an unrelated prompt opens a new session."""

from __future__ import annotations

import openai
import pytest

from drift.api.app import ApiConfig, build_api_app
from drift.api.prefix import SessionPool, common_prefix
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, Rows, reference
from tests.client.push_helpers import record_sends
from tests.server.test_live_load import wait_until

pytestmark = pytest.mark.timeout(180)


def _ids(local_model, messages) -> list[int]:
    tokenizer = local_model[1]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


async def test_next_turn_continues_the_held_session(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)
    pool = SessionPool(model, max_sessions=2)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID, pool=pool)
    service = ServiceConfig(max_concurrent=2, max_batch=8)  # a lone request: a batch of one
    url = await web_apps.start(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)

    async def chat(messages) -> str:
        resp = await client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=12, temperature=0
        )
        want = reference(local_model, _ids(local_model, messages), 12)[0]
        assert resp.choices[0].message.content == want
        return want

    async with client:
        first = await chat(MESSAGES)
        assert pool.hits == 0 and len(pool) == 1
        # the held session's servers were told it is idle: no step of theirs waits for it
        batchers = [running.server.sessions.batcher for running in swarm.servers]

        async def told() -> bool:
            return [b.idle_notices for b in batchers] == [1, 1]

        await wait_until(told, "both servers to hear that the held session is idle")
        turn = [*MESSAGES, {"role": "assistant", "content": first},
                {"role": "user", "content": "And then?"}]  # fmt: skip
        second = await chat(turn)
        assert pool.hits == 1 and pool.reused_tokens >= len(_ids(local_model, MESSAGES)) - 1
        third = [*turn, {"role": "assistant", "content": second},
                 {"role": "user", "content": "Why?"}]  # fmt: skip
        await chat(third)
        assert pool.hits == 2
        edited = [*MESSAGES, {"role": "assistant", "content": first[:3] + "zz"},
                  {"role": "user", "content": "Again"}]  # fmt: skip
        await chat(edited)  # shares the first turn and a part of its answer: rolled back
        assert pool.hits == 3
        other = [{"role": "user", "content": "Something else entirely, please"}]
        await chat(other)
        assert pool.hits == 3 and len(pool) == 2  # a new session beside the held one


async def test_a_chats_session_opens_with_its_first_step(
    model_dir, local_model, swarms, sdk_models, web_apps, monkeypatch
) -> None:
    """`drift api` does not wait for its sessions' opens: a request's first step goes out
    right behind them (one round trip less before the first token). Where the headroom a
    held session keeps for the next turn passes a server's length limit, the session opens
    without it, and the answer is the same."""
    ids = _ids(local_model, MESSAGES)
    max_tokens = 12
    limit = len(ids) + max_tokens + 100  # the prompt and answer fit, 512 more do not
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], inference_max_length=limit)
    model = await sdk_models.open(model_dir, swarm.token)
    pool = SessionPool(model, max_sessions=2)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID, pool=pool)
    service = ServiceConfig(max_concurrent=2, max_batch=8)
    url = await web_apps.start(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    sent = record_sends(monkeypatch)
    async with client:
        resp = await client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, max_tokens=max_tokens, temperature=0
        )
    assert resp.choices[0].message.content == reference(local_model, ids, max_tokens)[0]
    assert sent[0][1]  # sent while its opens were unanswered
    (held,) = pool._held.values()
    assert held.session.max_length == len(ids) + max_tokens  # without its headroom
    assert not model.client.bans.banned()


async def test_a_server_without_room_gets_the_apis_held_sessions_back(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    """To the servers the API is one client: its held sessions count against its share of
    their KV budget (client_cache_share, 0.5 by default). A new conversation that would pass
    the share makes the API close its oldest held session, and is answered; the refusal is
    no fault of the server's, which stays routable (main: the request failed with a 503
    after the client banned the only server of each span)."""
    headroom, max_tokens = 512, 12  # swarm_engine's default headroom for pooled sessions
    conversations = [
        MESSAGES,
        [{"role": "system", "content": "BE BRIEF."}, {"role": "user", "content": "HI THERE"}],
        [{"role": "system", "content": "SPEAK PLAINLY."}, {"role": "user", "content": "GOOD DAY"}],
    ]
    ids = [_ids(local_model, c) for c in conversations]
    assert all(common_prefix(a, b) < 16 for a in ids for b in ids if a is not b)  # none continues
    needs = [len(i) + max_tokens + headroom for i in ids]
    room = 5 * max(needs)  # tokens per block; the share: 2.5 sessions' worth
    assert sum(needs[:2]) <= room // 2 < sum(needs)  # two held fit it, a third does not
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], attn_cache_tokens=room)
    model = await sdk_models.open(model_dir, swarm.token)
    pool = SessionPool(model, max_sessions=4)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID, pool=pool,
                          headroom_tokens=headroom)  # fmt: skip
    service = ServiceConfig(max_concurrent=2, max_batch=8)
    url = await web_apps.start(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    async with client:
        for i, messages in enumerate(conversations):
            resp = await client.chat.completions.create(
                model=MODEL_ID, messages=messages, max_tokens=max_tokens, temperature=0
            )
            want = reference(local_model, _ids(local_model, messages), max_tokens)[0]
            assert resp.choices[0].message.content == want
            assert pool.released == (1 if i == 2 else 0)  # the third needed the first's room
    assert len(pool) == 2 and not model.client.bans.banned()


async def _tokens_computed(swarm) -> list[int]:
    """Each server's drift_tokens_total (tokens its blocks ran, padding included)."""
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as http:
        for running in swarm.servers:
            async with http.get(f"{running.url}/metrics") as resp:
                text = await resp.text()
            line = next(x for x in text.splitlines() if x.startswith("drift_tokens_total "))
            out.append(int(float(line.split()[1])))
    return out


async def test_requests_sharing_a_held_prefix_are_forked_from_it(
    model_dir, local_model, swarms, sdk_models
) -> None:
    """Requests whose prompts start with a part of a held session's tokens (a long system
    prompt), sent together (one group) or alone, are forked from it: the servers copy the
    prefix's caches and compute only the rest of each prompt, the held session stays for
    its own conversation, and every answer equals local transformers'. A group sharing a
    prefix no session holds has it computed once, then held."""
    from drift.api.continuous import ContinuousBatcher

    system = "You are a helpful assistant who answers every question in one short line."
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)
    pool = SessionPool(model, max_sessions=4)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID, pool=pool)
    asks = ["Hi there", "What is two and two?", "Name a colour", "Why?", "And you?", "Go on",
            "Count to three", "Say yes"]  # fmt: skip
    prompts = [_ids(local_model, [{"role": "system", "content": system},
                                  {"role": "user", "content": ask}]) for ask in asks]  # fmt: skip
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    assert shared >= 2 * max(len(p) - shared for p in prompts)  # a prefix worth forking
    n = 8
    rows = Rows(prompts, [n] * len(prompts))
    tokens = rows.tokens

    async def run(*indices: int) -> list[int]:
        """Submit the rows together; the tokens each server computed for them."""
        before = await _tokens_computed(swarm)
        loop.submit(*(rows.row(i) for i in indices))
        await rows.wait(*indices)
        return [a - b for a, b in zip(await _tokens_computed(swarm), before, strict=True)]

    loop = ContinuousBatcher(engine, max_batch=8)
    group = [1, 2, 3]
    width = max(len(prompts[i]) for i in group) - shared
    try:
        # together, with nothing held: the shared prefix is computed once, in a one-row
        # session then held, and the group is forked from it
        computed = await run(*group)
        assert loop.stats.groups == 1 and pool.hits == 1 and len(pool) == 1
        assert computed == [shared + len(group) * (width + n - 1)] * 2
        computed = await run(0)  # alone, continuing the held prefix: it takes it
        assert pool.hits == 2 and len(pool) == 1
        assert computed == [len(prompts[0]) - shared + n - 1] * 2
        computed = await run(4)  # alone, sharing a part of that conversation: forked
        assert pool.hits == 3 and len(pool) == 2  # held beside the first conversation
        assert computed == [len(prompts[4]) - shared + n - 1] * 2
        again = [5, 6, 7]  # together again: forked from a held conversation
        computed = await run(*again)
        assert loop.stats.groups == 4 and pool.hits == 4 and len(pool) == 2
        width = max(len(prompts[i]) for i in again) - shared
        assert computed == [len(again) * (width + n - 1)] * 2
    finally:
        loop.close()
    for i, prompt in enumerate(prompts):
        assert engine.decode(tokens[i]) == reference(local_model, prompt, n)[0]


async def test_without_the_engine_loop_a_request_sharing_a_system_prompt_is_forked(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    """`--max_batch 1` (no engine loop: each request its own generate()): a conversation
    sharing only the system prompt of a held one starts from a fork of it, and both stay
    held; answers equal local transformers'."""
    system = "You are a helpful assistant who answers every question in one short line."
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)
    pool = SessionPool(model, max_sessions=4)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID, pool=pool)
    service = ServiceConfig(max_concurrent=2, max_batch=1)
    url = await web_apps.start(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    async with client:
        for i, ask in enumerate(["Hi there", "Name a colour"]):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": ask}]
            before = await _tokens_computed(swarm)
            resp = await client.chat.completions.create(
                model=MODEL_ID, messages=messages, max_tokens=6, temperature=0
            )
            computed = [a - b for a, b in zip(await _tokens_computed(swarm), before, strict=True)]
            ids = _ids(local_model, messages)
            assert resp.choices[0].message.content == reference(local_model, ids, 6)[0]
            if i == 1:  # forked at the shared prefix: only the rest was computed
                first = _ids(local_model, [{"role": "system", "content": system},
                                           {"role": "user", "content": "Hi there"}])  # fmt: skip
                assert computed == [len(ids) - common_prefix(first, ids) + 5] * 2
    assert pool.hits == 1 and len(pool) == 2
