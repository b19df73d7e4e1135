"""Fixtures: a tiny random-weight llama with a character-level chat tokenizer, served by a
real `drift api` app on 127.0.0.1 (port 0), and the official `openai` client pointed at it."""

from __future__ import annotations

import string
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import torch
from aiohttp import web
from tokenizers import Tokenizer, decoders, models
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from drift.api.app import ApiConfig, build_api_app
from drift.api.engine import CausalLMEngine
from drift.api.service import ServiceConfig
from tests.tiny_models import TINY_CONFIGS

MODEL_ID = "tiny-chat"
API_KEY = "sk-test-key"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = list(string.printable[:95]) + ["\n"]  # printable ASCII (no \t\r\x0b\x0c) + newline
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """One token per character; decoding concatenates. Always decodes to valid text."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(CHARS)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )
    fast.chat_template = chat_template
    return fast


def tiny_chat_model(seed: int = 0) -> AutoModelForCausalLM:
    params = dict(TINY_CONFIGS["llama"])
    params.pop("model_type")
    params.update(
        vocab_size=len(SPECIALS) + len(set(CHARS)),
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = AutoConfig.for_model("llama", **params)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


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


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


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
