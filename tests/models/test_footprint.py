"""The memory prices of drift.models.footprint against what loaded spans and caches hold."""

from __future__ import annotations

import pytest
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.footprint import block_weight_bytes, client_bytes, kv_values_per_token
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
