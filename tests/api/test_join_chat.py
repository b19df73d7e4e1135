"""`drift generate` and `drift api` (whose chat page the dashboard links) on a machine with no
copy of the model: no MODEL given, the client parts (config, tokenizer, chat template,
embeddings, Gemma 4's per-layer embeddings, head) come from the swarm.

A tiny Gemma 4 with a one-token-per-character tokenizer and a chat template stands in for a
real chat model (offline); the replies must equal local transformers' on the same weights."""

from __future__ import annotations

import asyncio
import string
from pathlib import Path

import openai
import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from drift.api.app import ApiConfig, build_api_app
from drift.api.service import ServiceConfig
from drift.cli.api import _engine
from drift.cli.generate import encode_prompt, generate, load_client
from drift.cli.main import build_parser
from drift.identity.tokens import parse_join_tokens
from tests.tiny_models import tiny_config

pytestmark = pytest.mark.timeout(180)
NAME = "acme-gemma-chat"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def acme_dir(tmp_path_factory) -> Path:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|user|>", "<|assistant|>"]
    chars = sorted(set(string.printable[:95]) | {"\n"})
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(specials + chars)}, merges=[],
                               unk_token="<unk>"))  # fmt: skip
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                        eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")  # fmt: skip
    tokenizer.chat_template = TEMPLATE
    config = tiny_config("gemma4_text")
    config.vocab_size = config.vocab_size_per_layer_input = len(tokenizer)
    config.pad_token_id, config.eos_token_id, config.bos_token_id = 0, 1, 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    directory = tmp_path_factory.mktemp("models") / NAME
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def _local(directory: Path, prompt: str, n: int) -> str:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    local = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = encode_prompt(tokenizer, prompt)
    out = local.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, pad_token_id=0)  # fmt: skip
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


async def test_generate_and_api_with_nothing_but_the_token(acme_dir, swarms, web_apps, tmp_path):
    swarm = await swarms.start(acme_dir, [(0, 4), (4, 6)], parts_cache=tmp_path / "srv")
    want = _local(acme_dir, "Hi there", 6)
    tokens = parse_join_tokens(swarm.token)
    model, tokenizer = await asyncio.to_thread(
        load_client, None, tokens, swarm_key=None, cache_dir=str(tmp_path / "gen"),
        torch_dtype="float32",
    )  # fmt: skip
    try:
        assert tokenizer.chat_template == TEMPLATE  # the swarm's copy of the template
        result = await asyncio.to_thread(generate, model, tokenizer, "Hi there",
                                         max_new_tokens=6, stream=False,
                                         do_sample=False)  # fmt: skip
    finally:
        await asyncio.to_thread(model.close)
    assert result.text == want and result.new_tokens >= 2
    from drift import load_tokenizer  # README's quickstart: no name, the swarm's model

    alone = await asyncio.to_thread(load_tokenizer, initial_peers=swarm.token,
                                    cache_dir=tmp_path / "tok")  # fmt: skip
    assert (
        alone.chat_template == TEMPLATE and alone("Hi")["input_ids"] == tokenizer("Hi")["input_ids"]
    )

    args = build_parser().parse_args(["api", "--initial_peers", swarm.token, "--no_auth",
                                      "--cache_dir", str(tmp_path / "api")])  # fmt: skip
    engine = await asyncio.to_thread(_engine, args, None)
    assert engine.model_id == NAME  # no MODEL: the name the swarm announces
    config = ApiConfig(api_keys=(), service=ServiceConfig(max_concurrent=1))
    url = await web_apps.start(build_api_app(engine, config))
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                                      timeout=60) as client:  # fmt: skip
            listed = [m.id for m in (await client.models.list()).data]
            resp = await client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "Hi there"}], max_tokens=6,
                temperature=0,
            )  # fmt: skip
    finally:
        await asyncio.to_thread(engine.model.close)
    assert listed == [NAME]
    assert resp.choices[0].message.content == want
