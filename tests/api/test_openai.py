"""The `drift api` app driven by the official `openai` client, checked against plain
`transformers` generate() on the same weights (greedy answers must be identical)."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
import torch

from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, SPECIALS, chat_ids, reference

pytestmark = pytest.mark.timeout(120)


async def test_models_list(client: openai.AsyncOpenAI) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert (await client.models.retrieve(MODEL_ID)).id == MODEL_ID


async def test_chat_greedy_equals_transformers(client, local_model) -> None:
    prompt = chat_ids(local_model)
    text, n_tokens, finish = reference(local_model, prompt, 24)
    assert text, "the reference must produce some text for this test to mean anything"
    resp = await client.chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=24, temperature=0
    )
    assert resp.choices[0].message.content == text
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason == finish
    assert resp.usage.prompt_tokens == len(prompt)
    assert resp.usage.completion_tokens == n_tokens
    assert resp.usage.total_tokens == len(prompt) + n_tokens


async def test_chat_stream_equals_transformers(client, local_model) -> None:
    text, n_tokens, finish = reference(local_model, chat_ids(local_model), 24)
    stream = await client.chat.completions.create(
        model=MODEL_ID,
        messages=MESSAGES,
        max_completion_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finishes, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert "".join(parts) == text
    assert finishes == [finish]
    assert usage is not None and usage.completion_tokens == n_tokens


async def test_completion_greedy_and_stream(client, local_model) -> None:
    tokenizer = local_model[1]
    prompt = "Once upon a time"
    text, n_tokens, _ = reference(local_model, tokenizer(prompt)["input_ids"], 30)
    resp = await client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=30, temperature=0
    )
    assert resp.choices[0].text == text
    assert resp.usage.completion_tokens == n_tokens
    stream = await client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=30, temperature=0, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == text
    echoed = await client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=30, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompt + text


async def test_stop_strings_trimmed(client, local_model) -> None:
    tokenizer = local_model[1]
    prompt = "Once upon a time"
    text, _, _ = reference(local_model, tokenizer(prompt)["input_ids"], 40)
    stop = text[12:15]
    expected = text[: text.find(stop)]
    assert len(stop) == 3 and len(expected) < len(text) - 3
    resp = await client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=40, temperature=0, stop=["@@@never", stop]
    )
    assert resp.choices[0].text == expected
    assert resp.choices[0].finish_reason == "stop"
    stream = await client.completions.create(
        model=MODEL_ID, prompt=prompt, max_tokens=40, temperature=0, stop=stop, stream=True
    )
    chunks = [c.choices[0] async for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == expected
    assert all(stop not in c.text for c in chunks)
    assert chunks[-1].finish_reason == "stop"


async def test_wrong_or_missing_key(api_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{api_url}/v1", api_key="sk-wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as info:
            await c.models.list()
        assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{api_url}/v1/models") as r:  # no Authorization header at all
            assert r.status == 401
            assert "missing API key" in (await r.json())["error"]["message"]
        async with http.get(f"{api_url}/health") as r:  # /health stays open
            assert r.status == 200


async def test_unknown_model(client) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    assert "gpt-4o" in info.value.message


async def test_context_too_long(client) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=MODEL_ID, prompt="x" * 1000, max_tokens=100)
    assert info.value.code == "context_length_exceeded"
    assert "1024" in info.value.message
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model=MODEL_ID, prompt="x" * 1100)


async def test_wrong_types_are_400_in_openai_shape(api_url: str) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    bad_bodies = [
        ({"model": MODEL_ID, "messages": MESSAGES, "temperature": "hot"}, "temperature"),
        ({"model": MODEL_ID, "messages": MESSAGES, "max_tokens": True}, "max_tokens"),
        ({"model": MODEL_ID, "messages": "hello"}, "messages"),
        ({"model": MODEL_ID, "messages": MESSAGES, "stop": [1, 2]}, "stop"),
        ({"model": MODEL_ID, "messages": MESSAGES, "n": 0}, "n"),
    ]
    async with aiohttp.ClientSession(headers=headers) as http:
        for body, param in bad_bodies:
            async with http.post(f"{api_url}/v1/chat/completions", json=body) as r:
                assert r.status == 400, body
                error = (await r.json())["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["param"] == param and error["type"] == "invalid_request_error"
        async with http.post(f"{api_url}/v1/completions", data=b"{not json") as r:
            assert r.status == 400
        unknown = {"model": MODEL_ID, "prompt": "a", "max_tokens": 2, "unknown_field": {"x": 1}}
        async with http.post(f"{api_url}/v1/completions", json=unknown) as r:
            assert r.status == 400  # as OpenAI: an unrecognized argument is refused, by name
            error = (await r.json())["error"]
            assert error["code"] == "unknown_parameter" and error["param"] == "unknown_field"
            assert "unknown_field" in error["message"]
        ignored = {"model": MODEL_ID, "prompt": "a", "max_tokens": 2, "user": "u1"}
        async with http.post(f"{api_url}/v1/completions", json=ignored) as r:
            assert r.status == 200  # bookkeeping fields change nothing and are accepted


async def _health(api_url: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{api_url}/health") as r:
            return await r.json()


async def test_closed_stream_stops_generation(client, api_url: str) -> None:
    stream = await client.completions.create(
        model=MODEL_ID, prompt="Once", max_tokens=1000, temperature=0, stream=True
    )
    got = 0
    async for chunk in stream:
        got += len(chunk.choices[0].text) if chunk.choices else 0
        if got >= 3:
            break
    assert (await _health(api_url))["active"] == 1
    await stream.close()
    for _ in range(100):
        health = await _health(api_url)
        if health["active"] == 0:
            break
        await asyncio.sleep(0.05)
    assert health["active"] == 0, "generation went on after the client closed the stream"
    assert health["tokens_generated"] < 1000


@pytest.mark.parametrize("service_config", [dict(max_concurrent=1, queue_size=0)], indirect=True)
async def test_full_queue_is_429(client) -> None:
    stream = await client.completions.create(
        model=MODEL_ID, prompt="Once", max_tokens=1000, temperature=0, stream=True
    )
    async for _ in stream:
        break
    with pytest.raises(openai.RateLimitError):
        await client.completions.create(model=MODEL_ID, prompt="a", max_tokens=2)
    await stream.close()


async def test_sampling_n_seed_reproducible(client) -> None:
    kwargs = dict(model=MODEL_ID, prompt="Once", max_tokens=12, temperature=1.5, top_p=0.95, n=3)
    first = await client.completions.create(seed=7, **kwargs)
    again = await client.completions.create(seed=7, **kwargs)
    other = await client.completions.create(seed=8, **kwargs)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.text for c in again.choices]
    assert texts != [c.text for c in other.choices]
    assert len(set(texts)) > 1
    assert first.usage.completion_tokens == sum(
        12 if c.finish_reason == "length" else 0 for c in first.choices
    ) or any(c.finish_reason == "stop" for c in first.choices)


async def test_completion_logprobs_match_model(client, local_model) -> None:
    model, tokenizer = local_model
    prompt_ids = tokenizer("Once upon")["input_ids"]
    resp = await client.completions.create(
        model=MODEL_ID, prompt="Once upon", max_tokens=5, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    text, _, _ = reference(local_model, prompt_ids, 5)
    assert "".join(lp.tokens) == text == resp.choices[0].text
    ids = torch.tensor([prompt_ids + tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0], dim=-1)  # [T, V]
    for i, (token, value) in enumerate(zip(lp.tokens, lp.token_logprobs, strict=True)):
        row = logprobs[len(prompt_ids) - 1 + i]
        assert value == pytest.approx(float(row.max()), abs=1e-4)  # greedy: the best token
        assert (
            len(lp.top_logprobs[i]) == 3
            and max(lp.top_logprobs[i], key=lp.top_logprobs[i].get) == token
        )


async def test_chat_n_stream_matches_non_stream_and_logprobs(client) -> None:
    kwargs = dict(model=MODEL_ID, messages=MESSAGES, max_tokens=10, temperature=1.0, n=2, seed=3)
    full = await client.chat.completions.create(logprobs=True, top_logprobs=2, **kwargs)
    stream = await client.chat.completions.create(stream=True, **kwargs)
    texts = ["", ""]
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in full.choices]
    for choice in full.choices:
        entries = choice.logprobs.content
        tokens = [e.token for e in entries if e.token not in SPECIALS]  # decoded without them
        assert "".join(tokens) == choice.message.content
        assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


async def test_client_gone_without_stream_cancels(api_url: str) -> None:
    body = {"model": MODEL_ID, "prompt": "Once", "max_tokens": 1000, "temperature": 0}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        with pytest.raises(asyncio.TimeoutError):
            await http.post(
                f"{api_url}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.5)
            )
    for _ in range(100):
        health = await _health(api_url)
        if health["active"] == 0:
            break
        await asyncio.sleep(0.05)
    assert health["active"] == 0 and health["tokens_generated"] < 1000
