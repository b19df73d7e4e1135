"""The CLI's --torch_dtype auto keeps its promise (float32 on CPU) for the client head of
`drift generate` / `drift api`, also for a checkpoint stored in bfloat16."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from drift.cli.generate import load_client
from drift.identity.tokens import parse_join_tokens
from tests.tiny_models import tiny_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama"), dtype=torch.bfloat16).eval()
    directory = tmp_path_factory.mktemp("models") / "tiny-bf16"
    model.save_pretrained(directory, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(directory)
    assert str(model.config.dtype).endswith("bfloat16")  # the checkpoint says bfloat16
    return directory


@pytest.mark.parametrize(("flag", "want"), [("auto", torch.float32), ("bfloat16", torch.bfloat16)])
async def test_cli_auto_dtype_is_float32_on_cpu(bf16_dir, swarms, flag, want):
    swarm = await swarms.start(bf16_dir, [(0, 2), (2, 4)])
    tokens = parse_join_tokens(swarm.token)
    model, _ = await asyncio.to_thread(load_client, str(bf16_dir), tokens, swarm_key=None,
                                       cache_dir=None, torch_dtype=flag)  # fmt: skip
    try:
        assert model.dtype == want
        assert model.get_input_embeddings().weight.dtype == want
    finally:
        await asyncio.to_thread(model.close)
