"""Fixtures: a tiny random-weight llama with a character-level chat tokenizer, served by a
real `drift api` app on 127.0.0.1 (port 0), and the official `openai` client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from drift.api.service import ServiceConfig
from tests.api.apps import API_KEY, MODEL_ID, char_tokenizer, start_app, tiny_chat_model  # noqa: F401


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-chat")
    tiny_chat_model().save_pretrained(directory, safe_serialization=True)
    char_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def local_model(model_dir: Path):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


@pytest.fixture
def service_config(request: pytest.FixtureRequest) -> ServiceConfig:
    overrides = getattr(request, "param", {})  # parametrize(..., indirect=True) to change it
    return ServiceConfig(
        **{"max_concurrent": 2, "queue_size": 4, "default_max_tokens": 64, **overrides}
    )


@pytest.fixture
async def api_url(local_model, service_config: ServiceConfig) -> AsyncIterator[str]:
    model, tokenizer = local_model
    engine = CausalLMEngine(model, tokenizer, model_id=MODEL_ID)
    app = build_api_app(engine, ApiConfig(api_keys=("other-key", API_KEY), service=service_config))
    runner, url = await start_app(app)
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{api_url}/v1", api_key=API_KEY, max_retries=0, timeout=60
    ) as c:
        yield c
