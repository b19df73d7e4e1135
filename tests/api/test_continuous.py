"""The engine loop of `drift api` (drift.api.continuous) over a real loopback swarm:
requests arriving at different times share its steps and each answers as it would alone
(and as local transformers does); a cancelled stream leaves at once and frees its
servers' caches; at most `max_batch` rows run, the others wait instead of failing."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from drift.api.app import METRICS, SERVICE, ApiConfig, build_api_app
from drift.api.continuous import ContinuousBatcher
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from tests.api.apps import API_KEY, MODEL_ID, Rows, reference

pytestmark = pytest.mark.timeout(240)

PROMPTS = ["Once upon a time", "The cat sat", "Hello there, friend", "Why is the sky blue?",
           "One two three", "A tiny model"]  # fmt: skip


async def _api(swarms, sdk_models, web_apps, model_dir, local_model, max_batch: int,
               spans=((0, 2), (2, 4))) -> tuple:  # fmt: skip
    """(swarm, openai client, the service's engine loop) of a `drift api` over `spans`."""
    swarm = await swarms.start(model_dir, list(spans))
    model = await sdk_models.open(model_dir, swarm.token)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
    service = ServiceConfig(max_concurrent=8, queue_size=8, max_batch=max_batch)
    app = build_api_app(engine, ApiConfig(api_keys=(API_KEY,), service=service))
    url = await web_apps.start(app)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    return swarm, client, app[SERVICE].loop, app


async def _stream(client, prompt: str, max_tokens: int, delay: float = 0.0, **kw) -> str:
    await asyncio.sleep(delay)
    stream = await client.completions.create(model=MODEL_ID, prompt=prompt, stream=True,
                                             max_tokens=max_tokens, **kw)  # fmt: skip
    return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])


def _solo(local_model, prompt: str, n: int) -> str:
    return reference(local_model, local_model[1](prompt)["input_ids"], n)[0]


async def _sessions(swarm) -> list[int]:
    async with aiohttp.ClientSession() as http:
        out = []
        for running in swarm.servers:
            async with http.get(f"{running.url}/blocks") as r:
                out.append((await r.json())["active_sessions"])
        return out


async def test_staggered_requests_share_steps_and_answer_as_alone(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    swarm, client, loop, app = await _api(swarms, sdk_models, web_apps, model_dir, local_model, 8)
    assert loop is not None
    n = 40
    want = [_solo(local_model, p, n) for p in PROMPTS[:4]]
    async with client:
        got = await asyncio.gather(*(_stream(client, p, n, delay=0.02 * i, temperature=0)
                                     for i, p in enumerate(PROMPTS[:4])))  # fmt: skip
        assert list(got) == want
        # rows joined the running ones: fewer steps than rows stepped, several per step
        assert loop.stats.most_rows >= 2
        assert loop.stats.steps < loop.stats.row_steps
        shown = app[METRICS].render()
        assert f"drift_api_engine_row_steps {loop.stats.row_steps}" in shown
        # seeded sampling and log-probs stay per row: the same with others as alone
        kw = dict(temperature=0.9, seed=7, logprobs=2)
        alone = await client.completions.create(model=MODEL_ID, prompt=PROMPTS[4], max_tokens=12,
                                                **kw)  # fmt: skip
        together, *_ = await asyncio.gather(
            client.completions.create(model=MODEL_ID, prompt=PROMPTS[4], max_tokens=12, **kw),
            *(_stream(client, p, 30, temperature=0) for p in PROMPTS[:3]),
        )
        assert together.choices[0].text == alone.choices[0].text
        lp, lp_alone = together.choices[0].logprobs, alone.choices[0].logprobs
        assert lp.tokens == lp_alone.tokens
        assert lp.token_logprobs == pytest.approx(lp_alone.token_logprobs, abs=1e-4)
    assert loop.running == 0 and await _sessions(swarm) == [0, 0]


async def test_cancelled_stream_leaves_and_frees_its_sessions(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    swarm, client, loop, app = await _api(swarms, sdk_models, web_apps, model_dir, local_model, 8)
    want = _solo(local_model, PROMPTS[1], 30)
    async with client:
        long = await client.completions.create(model=MODEL_ID, prompt=PROMPTS[0], stream=True,
                                               max_tokens=900, temperature=0)  # fmt: skip
        async for _ in long:
            break
        other = asyncio.ensure_future(_stream(client, PROMPTS[1], 30, temperature=0))
        await long.close()
        for _ in range(100):
            if loop.running <= 1 and await _sessions(swarm) == [int(not other.done())] * 2:
                break
            await asyncio.sleep(0.05)
        assert await other == want  # the row beside the cancelled one is undisturbed
        for _ in range(100):
            if await _sessions(swarm) == [0, 0]:
                break
            await asyncio.sleep(0.05)
        assert loop.running == 0 and await _sessions(swarm) == [0, 0]
        assert loop.stats.row_steps < 900  # the cancelled row stopped early


async def test_max_batch_bounds_the_rows_and_the_rest_wait(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    _, client, loop, _ = await _api(swarms, sdk_models, web_apps, model_dir, local_model, 2)
    want = [_solo(local_model, p, 20) for p in PROMPTS]
    async with client:
        got = await asyncio.gather(*(_stream(client, p, 20, temperature=0) for p in PROMPTS))
    assert list(got) == want  # none failed: the extra ones waited for a row
    assert loop.stats.most_rows == 2


async def test_a_failed_row_is_its_own_error(
    model_dir, local_model, swarms, sdk_models, web_apps
) -> None:
    _, client, loop, _ = await _api(swarms, sdk_models, web_apps, model_dir, local_model, 8,
                                 spans=[(0, 2)])  # fmt: skip
    async with client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.completions.create(model=MODEL_ID, prompt="Once", max_tokens=4)
        assert info.value.status_code == 503 and info.value.code == "missing_blocks"
    assert loop.running == 0 and loop.waiting == 0


async def test_a_burst_shares_one_session_set_and_a_row_leaves_it_early(
    model_dir, local_model, swarms, sdk_models
) -> None:
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
    prompts = [engine.encode(p) for p in PROMPTS[:4]]
    lengths = [24, 24, 24, 200]

    def on_token(i: int, _event) -> None:
        if i == 3 and len(rows.tokens[i]) == 3:
            rows.cancel[i].set()  # as a client closing its stream

    rows = Rows(prompts, lengths, on_token)
    loop = ContinuousBatcher(engine, max_batch=4)
    try:
        loop.submit(*(rows.row(i) for i in range(4)))  # together: one left-padded group
        await rows.wait()
    finally:
        loop.close()
    assert loop.stats.groups == 1 and loop.stats.most_rows == 4
    for i in range(3):  # left padding and the other rows change no answer
        want = reference(local_model, prompts[i], lengths[i])[0]
        assert engine.decode(rows.tokens[i]) == want
    assert len(rows.tokens[3]) <= 4  # the cancelled row left at its next step
    assert loop.running == 0 and await _sessions(swarm) == [0, 0]


async def test_requests_arriving_a_moment_apart_at_an_idle_loop_share_one_group(
    model_dir, local_model, swarms, sdk_models, monkeypatch
) -> None:
    """A burst reaches the loop one request at a time (each parsed and tokenized on its own);
    an idle loop lets it gather, so the burst shares one session set (main: the first
    request went alone and the rest formed a second group, each step two sets of sessions
    on every server). The window is widened here so a slow machine cannot split it."""
    import drift.api.continuous as continuous

    monkeypatch.setattr(continuous, "GATHER_S", 0.1, raising=False)
    monkeypatch.setattr(continuous, "GATHER_CAP_S", 2.0, raising=False)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)
    engine = swarm_engine(model, local_model[1], model_id=MODEL_ID)
    prompts = [engine.encode(p) for p in PROMPTS[:3]]
    rows = Rows(prompts, [6] * len(prompts))
    loop = ContinuousBatcher(engine, max_batch=4)
    try:
        for i in range(len(prompts)):
            loop.submit(rows.row(i))
            await asyncio.sleep(0.01)
        await rows.wait()
    finally:
        loop.close()
    assert loop.stats.groups == 1 and loop.stats.most_rows == 3
    for i, prompt in enumerate(prompts):
        assert engine.decode(rows.tokens[i]) == reference(local_model, prompt, 6)[0]
