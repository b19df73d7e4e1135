"""Issue 24, finding 5 (API side): a json_schema nested 500 deep is a 400 naming the depth
limit, not a 500; embeddings take up to 2,048 inputs (as the README says); with no keys, a
browser's cross-origin text/plain POST is refused before any generation runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from drift.api.messages import MAX_SCHEMA_DEPTH
from drift.api.protocol import MAX_EMBED_INPUTS
from drift.api.service import ServiceConfig
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, start_app

pytestmark = pytest.mark.timeout(180)
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Raw:
    """JSON text spliced into a body as is (json encoders refuse 1,000 levels)."""

    def __init__(self, text: str) -> None:
        self.text = text


def nested(depth: int) -> Raw | dict:
    if depth <= 3:
        schema: dict = {"type": "string"}
        for _ in range(depth):
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        return schema
    return Raw(
        '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth
    )


def encode(value: object) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(encode(v) for v in value) + "]"
    return json.dumps(value)


async def post(url: str, path: str, body: dict, headers: dict = AUTH) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}{path}",
            data=encode(body),
            headers={**headers, "Content-Type": "application/json"},
        ) as resp:
            return resp.status, await resp.json()


async def test_a_deeply_nested_schema_is_a_400_naming_the_limit(api_url: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(500)}}
    status, body = await post(
        api_url,
        "/v1/chat/completions",
        {"model": MODEL_ID, "messages": MESSAGES, "response_format": fmt},
    )
    assert status == 400, body
    assert f"limit of {MAX_SCHEMA_DEPTH} levels" in body["error"]["message"]
    assert body["error"]["param"] == "response_format"
    tool = {"type": "function", "function": {"name": "f", "parameters": nested(500)}}
    status, body = await post(
        api_url, "/v1/chat/completions", {"model": MODEL_ID, "messages": MESSAGES, "tools": [tool]}
    )
    assert status == 400 and "MAX_SCHEMA_DEPTH" in body["error"]["message"], body
    # a schema within the limit still compiles and constrains
    fmt["json_schema"]["schema"] = nested(3)
    status, body = await post(api_url, "/v1/chat/completions",
                              {"model": MODEL_ID, "messages": MESSAGES, "response_format": fmt,
                               "max_tokens": 4})  # fmt: skip
    assert status == 200, body


async def test_embeddings_take_as_many_inputs_as_the_readme_says(api_url: str) -> None:
    status, body = await post(
        api_url, "/v1/embeddings", {"model": MODEL_ID, "input": [f"x{i}" for i in range(40)]}
    )
    assert status == 200 and len(body["data"]) == 40, body
    status, body = await post(
        api_url, "/v1/embeddings", {"model": MODEL_ID, "input": ["x"] * (MAX_EMBED_INPUTS + 1)}
    )
    assert status == 400 and f"at most {MAX_EMBED_INPUTS}" in body["error"]["message"]


@pytest.fixture
async def keyless_url(local_model) -> AsyncIterator[str]:
    model, tokenizer = local_model
    engine = CausalLMEngine(model, tokenizer, model_id=MODEL_ID)
    runner, base = await start_app(build_api_app(engine, ApiConfig((), service=ServiceConfig())))
    try:
        yield base
    finally:
        await runner.cleanup()


async def test_cross_origin_text_plain_post_is_refused_without_keys(keyless_url: str) -> None:
    payload = b'{"model": "%s", "prompt": "hi", "max_tokens": 2}' % MODEL_ID.encode()
    async with aiohttp.ClientSession() as http:
        for ctype in ("text/plain", "application/x-www-form-urlencoded"):
            async with http.post(f"{keyless_url}/v1/completions", data=payload,
                                 headers={"Origin": "http://evil.example",
                                          "Content-Type": ctype}) as resp:  # fmt: skip
                body = await resp.json()
                assert resp.status == 415 and "application/json" in body["error"]["message"]
        async with http.get(f"{keyless_url}/health") as resp:
            assert (await resp.json())["tokens_generated"] == 0
        # a JSON POST (what a page can send only after a CORS preflight) and a plain client run
        async with http.post(
            f"{keyless_url}/v1/completions",
            data=payload,
            headers={"Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_prompt_far_past_the_context_is_refused_before_tokenizing(local_model) -> None:
    """A 7 MB prompt cannot fit any context (it needs at least len / the vocabulary's longest
    token of them): chat, completions and embeddings refuse it by its length, and no such
    text reaches the tokenizer (which would spend seconds and ~0.5 GB on it)."""
    model, tokenizer = local_model
    engine = CausalLMEngine(model, tokenizer, model_id=MODEL_ID)
    seen: list[int] = []

    class Counting:  # the real tokenizer, noting the length of every text it is given
        def __call__(self, text, *args, **kwargs):
            seen.append(len(text))
            return tokenizer(text, *args, **kwargs)

        def __getattr__(self, name: str):
            return getattr(tokenizer, name)

    engine.tokenizer = Counting()
    runner, url = await start_app(build_api_app(engine, ApiConfig(api_keys=(API_KEY,))))
    text = "lorem ipsum " * 600_000  # 7.2 M characters
    try:
        for path, body in (
            ("/v1/chat/completions", {"model": MODEL_ID, "max_tokens": 1,
                                      "messages": [{"role": "user", "content": text}]}),
            ("/v1/completions", {"model": MODEL_ID, "max_tokens": 1, "prompt": text}),
            ("/v1/embeddings", {"model": MODEL_ID, "input": text}),
        ):  # fmt: skip
            status, payload = await post(url, path, body)
            assert status == 400, (path, payload)
            assert payload["error"]["code"] == "context_length_exceeded", payload
            assert "maximum context length" in payload["error"]["message"]
        assert max(seen, default=0) < 100_000, "a 7 MB text reached the tokenizer"
        status, payload = await post(url, "/v1/chat/completions",
                                     {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 2})  # fmt: skip
        assert status == 200, payload  # what fits is answered as before
    finally:
        await runner.cleanup()
