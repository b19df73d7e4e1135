"""Batching in `drift api` (ServiceConfig.max_batch): concurrent requests run as one
left-padded batch, yet every answer equals its unbatched one (greedy: local transformers;
seeded sampling: the same request alone), streams and stop strings work per request, and
a request that ends early completes while the rest of its batch still generates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import openai
import pytest

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from drift.api.service import ServiceConfig
from tests.api.apps import API_KEY, MESSAGES, MODEL_ID, chat_ids, reference, start_app

pytestmark = pytest.mark.timeout(120)


class RecordingEngine(CausalLMEngine):
    """The real engine; remembers the size of every batch it ran."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch_sizes: list[int] = []

    def generate_batch(self, rows) -> None:
        self.batch_sizes.append(len(rows))
        super().generate_batch(rows)


@pytest.fixture
async def batched(local_model) -> AsyncIterator[tuple[RecordingEngine, openai.AsyncOpenAI]]:
    model, tokenizer = local_model
    engine = RecordingEngine(model, tokenizer, model_id=MODEL_ID)
    service = ServiceConfig(max_concurrent=8, queue_size=8, max_batch=8, batch_wait_s=0.3)
    runner, url = await start_app(build_api_app(engine, ApiConfig((API_KEY,), service=service)))
    try:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60
        ) as client:
            yield engine, client
    finally:
        await runner.cleanup()


async def _stream_text(client, **kw) -> tuple[str, str]:
    stream = await client.completions.create(model=MODEL_ID, stream=True, **kw)
    text, finish = "", None
    async for chunk in stream:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    return text, finish


async def test_batched_greedy_equals_transformers(batched, local_model) -> None:
    engine, client = batched
    tok = local_model[1]
    prompts = ["Once upon", "A cat sat on the", "Hi", "The quick brown fox jumps"]
    lengths = [12, 5, 20, 9]
    refs = [
        reference(local_model, tok(p)["input_ids"], n)
        for p, n in zip(prompts, lengths, strict=True)
    ]
    chat_ref = reference(local_model, chat_ids(local_model), 16)
    stop_at = refs[2][0][3:5]  # a stop string inside the third answer
    assert stop_at and refs[2][0].index(stop_at) >= 1

    def complete(i: int, **kw):
        return client.completions.create(
            model=MODEL_ID, prompt=prompts[i], max_tokens=lengths[i], temperature=0, **kw
        )

    results = await asyncio.gather(
        complete(0),
        complete(1),
        complete(2, stop=[stop_at]),
        _stream_text(client, prompt=prompts[3], max_tokens=lengths[3], temperature=0),
        client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, max_tokens=16, temperature=0
        ),
    )
    assert max(engine.batch_sizes) >= 4  # they really ran together
    assert results[0].choices[0].text == refs[0][0]
    assert results[0].usage.completion_tokens == refs[0][1]
    assert results[1].choices[0].text == refs[1][0]
    assert results[2].choices[0].text == refs[2][0][: refs[2][0].index(stop_at)]
    assert results[2].choices[0].finish_reason == "stop"
    assert results[3] == (refs[3][0], refs[3][2])
    assert results[4].choices[0].message.content == chat_ref[0]


async def test_batched_seeded_sampling_equals_alone(batched) -> None:
    engine, client = batched

    def sample(prompt: str, seed: int):
        return client.completions.create(
            model=MODEL_ID, prompt=prompt, max_tokens=10, temperature=0.9, top_p=0.9,
            seed=seed, frequency_penalty=0.5, logprobs=2,
        )  # fmt: skip

    alone = await sample("Once upon", 7)
    assert engine.batch_sizes == [1]
    together = await asyncio.gather(sample("Once upon", 7), sample("Hi", 8), sample("Ab", 9))
    assert engine.batch_sizes[-1] == 3, engine.batch_sizes
    assert together[0].choices[0].text == alone.choices[0].text
    assert together[0].choices[0].logprobs.tokens == alone.choices[0].logprobs.tokens
    for a, b in zip(
        together[0].choices[0].logprobs.token_logprobs,
        alone.choices[0].logprobs.token_logprobs,
        strict=True,
    ):
        assert a == pytest.approx(b, abs=1e-4)


async def test_short_request_does_not_wait_for_its_batch(batched) -> None:
    engine, client = batched
    long = asyncio.create_task(
        _stream_text(client, prompt="Once upon", max_tokens=900, temperature=0)
    )
    short = await client.completions.create(
        model=MODEL_ID, prompt="Hi", max_tokens=2, temperature=0
    )
    assert short.usage.completion_tokens <= 2
    assert not long.done()  # the long row of the same batch is still generating
    assert engine.batch_sizes == [2]
    await long


async def test_request_arriving_mid_batch_starts_at_once(batched) -> None:
    """A request arriving while a batch generates does not wait for that batch to end."""
    engine, client = batched
    long = asyncio.create_task(
        _stream_text(client, prompt="Once upon", max_tokens=900, temperature=0)
    )
    while not engine.batch_sizes:  # the long one's batch is running
        await asyncio.sleep(0.01)
    late = await client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=3, temperature=0)
    assert late.usage.completion_tokens <= 3
    assert not long.done()  # it ran beside the long one's batch, not after it
    assert engine.batch_sizes == [1, 1]
    await long
