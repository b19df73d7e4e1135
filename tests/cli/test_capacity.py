"""The memory-based block count of `drift up` (pure arithmetic + meta-device parameter counts)."""

from __future__ import annotations

import pytest
import torch

from drift.cli._capacity import (
    blocks_that_fit,
    bytes_per_param,
    choose_num_blocks,
    free_memory,
    kv_values_per_token,
    params_per_block,
)
from drift.wire.errors import BadRequest
from tests.tiny_models import build_tiny, tiny_config


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_moe"])
def test_params_per_block_matches_the_real_layers(family):
    model = build_tiny(family)
    real = max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers)
    assert params_per_block(tiny_config(family)) == real


def test_kv_values_per_token():
    cfg = tiny_config("llama")  # 2 kv heads x head_dim 16, keys and values
    assert kv_values_per_token(cfg) == 2 * 2 * 16


def test_blocks_that_fit_arithmetic():
    n = blocks_that_fit(
        free_bytes=10_000, block_bytes=1000, cache_bytes=500, total_blocks=30, reserve_bytes=1000
    )
    assert n == (9000 - 1000) // 1500 == 5
    assert (
        blocks_that_fit(
            free_bytes=10**12, block_bytes=1000, cache_bytes=0, total_blocks=30, reserve_bytes=0
        )
        == 30
    )
    assert (
        blocks_that_fit(
            free_bytes=100, block_bytes=1000, cache_bytes=0, total_blocks=30, reserve_bytes=0
        )
        == 0
    )


def test_bytes_per_param():
    assert bytes_per_param(torch.float32) == 4 and bytes_per_param(torch.bfloat16) == 2
    assert 0.5 < bytes_per_param(torch.float16, "nf4") < 1 < bytes_per_param(torch.float16, "int8")
    with pytest.raises(BadRequest, match="unknown quantization"):
        bytes_per_param(torch.float16, "int3")


def test_choose_num_blocks_on_this_cpu():
    cfg = tiny_config("llama")
    cap = choose_num_blocks(cfg, torch.device("cpu"), torch.float32, cache_tokens=1024)
    assert cap.num_blocks == cfg.num_hidden_layers  # tiny blocks: all fit
    assert cap.free_bytes == pytest.approx(free_memory(torch.device("cpu")), rel=0.2)
    assert cap.cache_bytes == 64 * 1024 * 4
    assert "blocks fit" in cap.explain()
    # A KV cache bigger than the machine: nothing fits, and the error says what to change.
    with pytest.raises(BadRequest, match="--num_blocks"):
        choose_num_blocks(cfg, torch.device("cpu"), torch.float32, cache_tokens=10**12)
