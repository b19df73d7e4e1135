"""The memory prices of drift.models.footprint against what loaded spans and caches hold."""

from __future__ import annotations

import pytest
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.footprint import (
    FALCON_CACHES_GROUPED_KV,
    block_weight_bytes,
    client_bytes,
    kv_values_per_token,
)
from drift.models.head import ClientHead
from drift.models.quant import storage_bytes
from drift.models.span import ModelSpan
from tests.tiny_models import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_values_per_token_is_what_a_session_caches(tiny_dirs, family: str) -> None:
    ckpt = Checkpoint(tiny_dirs[family])
    n = ckpt.config.num_hidden_layers
    span = ModelSpan.load(ckpt, 0, n)
    session = span.new_session(batch_size=2, max_length=32)
    tokens = 9
    with torch.no_grad():
        session.step(torch.randn(2, tokens, ckpt.config.hidden_size))
    cached = [
        sum(t.numel() for t in (layer.keys, layer.values)) // (2 * tokens)
        for layer in session.cache.layers
    ]
    assert cached == [kv_values_per_token(ckpt.config)] * n, family


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_block_and_client_prices_are_what_loads(tiny_dirs, family: str, dtype) -> None:
    ckpt = Checkpoint(tiny_dirs[family])
    span = ModelSpan.load(ckpt, 0, ckpt.config.num_hidden_layers, dtype=dtype)
    assert [storage_bytes(layer) for layer in span.layers] == block_weight_bytes(ckpt.config, dtype)
    assert storage_bytes(ClientHead.load(ckpt, dtype=dtype)) == client_bytes(ckpt.config, dtype)


def test_kv_of_falcon_with_grouped_kv_heads(tmp_path) -> None:
    """falcon-40b's layout (new_decoder_architecture, num_kv_heads): transformers up to 5.24
    caches its K/V expanded to all query heads (4 x 16 each), from 5.25 on the 2 grouped heads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("falcon", new_decoder_architecture=True, num_kv_heads=2,
                                  num_attention_heads=4, hidden_size=64, num_hidden_layers=2,
                                  vocab_size=256, bias=False)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    ckpt = Checkpoint(tmp_path)
    session = ModelSpan.load(ckpt, 0, 2).new_session(batch_size=1, max_length=8)
    with torch.no_grad():
        session.step(torch.randn(1, 5, 64))
    layer = session.cache.layers[0]
    expected = 2 * 2 * 16 if FALCON_CACHES_GROUPED_KV else 2 * 4 * 16
    assert (
        (layer.keys.numel() + layer.values.numel()) // 5 == kv_values_per_token(config) == expected
    )


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "mistral3"])
def test_client_price_of_a_multimodal_save_is_what_loads(tmp_path, family: str) -> None:
    """Gemma 3's wrapper ties its head by the outer config (its text config says untied)."""
    from tests.multimodal_models import save_multimodal

    ckpt = Checkpoint(save_multimodal(family, tmp_path / family))
    head = ClientHead.load(ckpt)
    per_layer = storage_bytes(head.per_layer) if head.per_layer is not None else 0
    assert storage_bytes(head) - per_layer == client_bytes(ckpt.config, torch.float32)
