"""The API app's HTTP edges: /v1/embeddings (pooled final hidden states, equal to the
model's own last_hidden_state), CORS preflight without a key, /metrics, Retry-After,
unsupported parameters and template errors as OpenAI-shaped 400s, the chat page at /."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
import torch

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from drift.api.service import ServiceConfig
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, char_tokenizer, start_app, tiny_chat_model

pytestmark = pytest.mark.timeout(120)
WEB = Path(__file__).resolve().parents[2] / "web"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
async def url(local_model) -> AsyncIterator[str]:
    model, tokenizer = local_model
    engine = CausalLMEngine(model, tokenizer, model_id=MODEL_ID)
    config = ApiConfig((API_KEY,), service=ServiceConfig(max_concurrent=1, queue_size=0),
                       cors_origins=("http://app.example",), web_dir=WEB)  # fmt: skip
    runner, base = await start_app(build_api_app(engine, config))
    try:
        yield base
    finally:
        await runner.cleanup()


def reference_embedding(local_model, text: str) -> torch.Tensor:
    model, tokenizer = local_model
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        final = model.model(ids).last_hidden_state[0]  # [T, H], after the final norm
    return torch.nn.functional.normalize(final.mean(0), dim=-1)


async def test_embeddings(url, local_model) -> None:
    texts = ["The cat sat.", "A completely different and longer sentence!", "The cat sat."]
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0) as c:
        batch = await c.embeddings.create(model=MODEL_ID, input=texts)
        alone = await c.embeddings.create(model=MODEL_ID, input=texts[1])
        ids = local_model[1](texts[0])["input_ids"]
        by_ids = await c.embeddings.create(model=MODEL_ID, input=[ids])
        b64 = await c.with_options().embeddings.with_raw_response.create(
            model=MODEL_ID, input=texts[0], encoding_format="base64")  # fmt: skip
        card = await c.models.retrieve(MODEL_ID)
    vectors = [np.array(d.embedding) for d in batch.data]
    assert [d.index for d in batch.data] == [0, 1, 2] and batch.usage.prompt_tokens > 20
    for text, vector in zip(texts, vectors, strict=True):
        ref = reference_embedding(local_model, text).numpy()
        np.testing.assert_allclose(vector, ref, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])
    assert alone.data[0].embedding == batch.data[1].embedding  # never depends on batch-mates
    np.testing.assert_allclose(by_ids.data[0].embedding, vectors[0], atol=1e-6)
    raw = b64.http_response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(raw), dtype="<f4")
    np.testing.assert_allclose(decoded, vectors[0], atol=1e-6)
    assert card.model_extra["embeddings"]["pooling"] == "mean"
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for body, param in [({"input": "x", "dimensions": 3}, "dimensions"),
                            ({"input": []}, "input"), ({"input": [[10**9]]}, "input"),
                            ({"input": "x", "encoding_format": "int8"}, "encoding_format")]:  # fmt: skip
            async with http.post(f"{url}/v1/embeddings", json={"model": MODEL_ID, **body}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == param


async def test_cors_preflight_without_key_and_headers_on_streams(url) -> None:
    pre = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
    async with aiohttp.ClientSession() as http:
        async with http.options(f"{url}/v1/chat/completions", headers=pre) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert "authorization" in r.headers["Access-Control-Allow-Headers"]
        async with http.options(f"{url}/v1/models", headers={**pre, "Origin": "http://evil"}) as r:
            assert r.status == 403 and "--cors_origins" in (await r.json())["error"]["message"]
        body = {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 3, "stream": True}
        headers = {**AUTH, "Origin": "http://app.example"}
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            assert (
                r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
            )
            await r.read()
        async with http.get(f"{url}/v1/models", headers={"Origin": "http://app.example"}) as r:
            assert r.status == 401 and "Access-Control-Allow-Origin" in r.headers  # readable


async def test_metrics_and_retry_after(url) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        body = {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            n_prompt = (await r.json())["usage"]["prompt_tokens"]
        slow = {**body, "max_tokens": 600, "stream": True}
        async with http.post(f"{url}/v1/chat/completions", json=slow) as held:
            await held.content.readline()  # generating: the only slot is taken
            async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                assert r.status == 429 and r.headers["Retry-After"] == "1"
        ok = 'drift_api_requests_total{route="/v1/chat/completions",status="200"} 2'
        for _ in range(100):  # the held stream is counted once its handler has wound down
            async with http.get(f"{url}/metrics") as r:
                text = await r.text()
            if ok in text:
                break
            await asyncio.sleep(0.05)
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert lines['drift_api_requests_total{route="/v1/chat/completions",status="200"}'] == "2"
    assert lines['drift_api_requests_total{route="/v1/chat/completions",status="429"}'] == "1"
    assert int(lines["drift_api_prompt_tokens_total"]) >= 2 * n_prompt
    assert int(lines["drift_api_completion_tokens_total"]) >= 5
    assert int(lines["drift_api_time_to_first_token_seconds_count"]) == 2
    assert (
        "drift_api_queue_depth 0" in text
        and "# TYPE drift_api_decode_tokens_per_second histogram" in text
    )


async def test_unsupported_and_template_errors_are_400(url) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for body, param, code in [
            ({"logit_bias": {"5": 10}}, "logit_bias", "unsupported_parameter"),
            ({"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
            ({"top_k": 5}, "top_k", "unknown_parameter"),
            ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role", None),
        ]:  # fmt: skip
            full = {"model": MODEL_ID, "messages": MESSAGES, **body}
            async with http.post(f"{url}/v1/chat/completions", json=full) as r:
                error = (await r.json())["error"]
                assert r.status == 400 and error["param"] == param, error
                assert code is None or error["code"] == code
                assert param.split("[")[0] in error["message"] or "role" in error["message"]
        ok = {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 2, "logit_bias": {},
              "modalities": ["text"], "store": False, "metadata": {"a": "b"}}  # fmt: skip
        async with http.post(f"{url}/v1/chat/completions", json=ok) as r:
            assert r.status == 200  # "off" values of unsupported fields are fine


async def test_template_error_is_400() -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}x"
    engine = CausalLMEngine(tiny_chat_model(), char_tokenizer(strict), model_id="m")
    runner, base = await start_app(build_api_app(engine, ApiConfig()))
    try:
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as c:
            with pytest.raises(openai.BadRequestError) as info:
                await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    finally:
        await runner.cleanup()
    assert "first must be user" in info.value.message and info.value.param == "messages"


async def test_chat_page_served(url) -> None:
    async with aiohttp.ClientSession() as http:  # no key: the page asks for it
        async with http.get(f"{url}/") as r:
            assert r.status == 200 and "<title>" in await r.text()
        async with http.get(f"{url}/chat/chat.js") as r:
            assert r.status == 200
        async with http.get(f"{url}/chat/../../README.md") as r:
            assert r.status == 404
