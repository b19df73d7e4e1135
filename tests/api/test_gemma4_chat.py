"""Gemma 4's chat format through `drift generate` and `drift api` over a loopback swarm.

The real Gemma 4 tokenizer is not reachable offline, so a tiny one stands in: one token per
character plus Gemma 4's turn markers `<|turn>` / `<turn|>`, and a chat template in Gemma 4's
turn format (`<|turn>user\\n...<turn|>\\n<|turn>model\\n`). What is checked is DRIFT's part:
both commands render the tokenizer's own template, send exactly its ids, stop at `<turn|>`
(an eos id of generation_config.json, as Gemma 4 ships it) and answer what local
transformers answers on the same weights, with the swarm split across a K/V-sharing cut.
"""

from __future__ import annotations

import asyncio
import string
from pathlib import Path

import openai
import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

from drift.api.app import ApiConfig, build_api_app
from drift.api.service import ServiceConfig
from drift.api.swarm import swarm_engine
from drift.cli.generate import encode_prompt, generate, load_client
from drift.identity.tokens import parse_join_tokens
from tests.tiny_models import tiny_config

pytestmark = pytest.mark.timeout(180)

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
TURN_END = SPECIALS.index("<turn|>")
GEMMA4_TURNS = (
    "{{ bos_token }}{% for m in messages %}<|turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<turn|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Hi there"}]  # what `drift generate "Hi there"` sends
KEY, MODEL_ID = "sk-gemma4", "tiny-gemma4"


def _tokenizer() -> PreTrainedTokenizerFast:
    chars = sorted(set(string.printable[:95]) | {"\n"})
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   bos_token="<bos>", unk_token="<unk>")  # fmt: skip
    fast.chat_template = GEMMA4_TURNS
    return fast


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> Path:
    """A tiny Gemma 4 (per-layer inputs, shared K/V) that answers a few characters, then
    `<turn|>`: its head's row for `<turn|>` swaps with that of a token greedy decoding first
    picks at the 5th step or later (inputs and earlier steps stay as they were)."""
    directory = tmp_path_factory.mktemp("gemma4-chat")
    tokenizer = _tokenizer()
    config = tiny_config("gemma4_text")
    config.vocab_size = config.vocab_size_per_layer_input = len(tokenizer)
    config.tie_word_embeddings = False
    config.pad_token_id, config.eos_token_id, config.bos_token_id = 0, 1, 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids = encode_prompt(tokenizer, MESSAGES[0]["content"])
    out = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                         pad_token_id=0)[0, ids.shape[1] :].tolist()  # fmt: skip
    late = next(t for k, t in enumerate(out) if k >= 4 and t not in out[:k] and t > TURN_END)
    with torch.no_grad():
        head = model.lm_head.weight
        head[[TURN_END, late]] = head[[late, TURN_END]].clone()
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    GenerationConfig(eos_token_id=[1, TURN_END], pad_token_id=0, bos_token_id=2).save_pretrained(
        directory
    )
    return directory


def _local_reply(directory: Path, ids: torch.Tensor) -> tuple[list[int], str]:
    local = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    out = local.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                         do_sample=False, pad_token_id=0)[0, ids.shape[1] :]  # fmt: skip
    assert out[-1] == TURN_END and len(out) >= 5, "a few characters, then the end of the turn"
    return out.tolist(), tokenizer.decode(out, skip_special_tokens=True)


async def test_drift_generate_renders_the_gemma4_template(chat_dir, swarms):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(chat_dir)
    ids = encode_prompt(tokenizer, "Hi there")
    text = tokenizer.decode(ids[0])
    assert text == "<bos><|turn>user\nHi there<turn|>\n<|turn>model\n"
    reply_ids, reply = _local_reply(chat_dir, ids)
    swarm = await swarms.start(chat_dir, [(0, 4), (4, 6)])  # 4, 5 read K/V of 3 and 2
    tokens = parse_join_tokens(swarm.token)
    model, tok = await asyncio.to_thread(
        load_client, str(chat_dir), tokens, swarm_key=None, cache_dir=None, torch_dtype="float32"
    )
    try:
        result = await asyncio.to_thread(
            generate, model, tok, "Hi there", max_new_tokens=24, stream=False, do_sample=False
        )
    finally:
        await asyncio.to_thread(model.close)
    assert result.text == reply and result.new_tokens == len(reply_ids)
    assert [(start, end) for _, _, start, end in result.route] == [(0, 4), (4, 6)]


async def test_drift_api_chat_uses_the_gemma4_template(chat_dir, swarms, sdk_models, web_apps):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(chat_dir)
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == "<bos><|turn>user\nHi there<turn|>\n<|turn>model\n"
    prompt = torch.tensor([tokenizer(rendered, add_special_tokens=False)["input_ids"]])
    reply_ids, reply = _local_reply(chat_dir, prompt)
    swarm = await swarms.start(chat_dir, [(0, 4), (4, 6)])  # 4, 5 read K/V of 3 and 2
    model = await sdk_models.open(chat_dir, swarm.token)
    engine = swarm_engine(model, tokenizer, model_id=MODEL_ID)
    assert TURN_END in engine.eos_token_ids
    config = ApiConfig(api_keys=(KEY,), service=ServiceConfig(max_concurrent=1))
    url = await web_apps.start(build_api_app(engine, config))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0,
                                  timeout=60) as client:  # fmt: skip
        resp = await client.chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, max_tokens=24, temperature=0
        )
    assert resp.choices[0].message.content == reply
    assert resp.choices[0].finish_reason == "stop"  # at <turn|>
    assert resp.usage.prompt_tokens == prompt.shape[1]
    assert resp.usage.completion_tokens == len(reply_ids)
