"""One model name everywhere, in the API: a server started as `smollm2` (or with no MODEL,
named by the swarm's `SmolLM2-135M-Instruct`) answers requests naming it either way, or by
its Hub id; another model is still a 404. Real app on loopback, the official openai client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from tests.api.apps import API_KEY, MESSAGES, start_app

pytestmark = pytest.mark.timeout(120)

NAMES = ["smollm2", "SMOLLM2", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"]


@pytest.fixture(params=["smollm2", "SmolLM2-135M-Instruct"])
async def named_client(request, local_model) -> AsyncIterator[tuple[str, openai.AsyncOpenAI]]:
    model, tokenizer = local_model
    engine = CausalLMEngine(model, tokenizer, model_id=request.param)
    runner, url = await start_app(build_api_app(engine, ApiConfig(api_keys=(API_KEY,))))
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0,
                                      timeout=60) as client:  # fmt: skip
            yield request.param, client
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("typed", NAMES)
async def test_chat_accepts_every_name_of_the_served_model(named_client, typed: str) -> None:
    served, client = named_client
    resp = await client.chat.completions.create(model=typed, messages=MESSAGES, max_tokens=2,
                                                temperature=0)  # fmt: skip
    assert resp.model == served and resp.usage.completion_tokens >= 1
    assert (await client.models.retrieve(typed)).id == served


async def test_other_models_are_still_not_found(named_client) -> None:
    _, client = named_client
    for other in ("gemma3-270m", "SmolLM2-135M-Instruct:nosuchadapter", "gpt-4o"):
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model=other, messages=MESSAGES, max_tokens=2)
        assert info.value.code == "model_not_found", other
