"""The memory-based block count of `drift up`: arithmetic over drift.models.footprint prices."""

from __future__ import annotations

import pytest
import torch

from drift.cli._capacity import blocks_that_fit, choose_num_blocks, free_memory
from drift.models.footprint import block_weight_bytes, kv_bytes_per_token
from drift.wire.errors import BadRequest
from tests.tiny_models import tiny_config


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


def test_choose_num_blocks_on_this_cpu():
    cfg = tiny_config("llama")
    cap = choose_num_blocks(cfg, torch.device("cpu"), torch.float32, cache_tokens=1024)
    assert cap.num_blocks == cfg.num_hidden_layers  # tiny blocks: all fit
    assert cap.free_bytes == pytest.approx(free_memory(torch.device("cpu")), rel=0.2)
    assert cap.cache_bytes == 64 * 1024 * 4
    assert cap.block_bytes == max(block_weight_bytes(cfg, torch.float32))
    assert "blocks fit" in cap.explain()
    # A KV cache bigger than the machine: nothing fits, and the error says what to change.
    with pytest.raises(BadRequest, match="--num_blocks"):
        choose_num_blocks(cfg, torch.device("cpu"), torch.float32, cache_tokens=10**12)
    with pytest.raises(BadRequest, match="unknown quantization"):
        choose_num_blocks(cfg, torch.device("cpu"), torch.float32, quant="int3", cache_tokens=1)


def test_quantization_fits_more_blocks_in_the_same_memory():
    """What `drift up --quant_type` sizes its span by: the quantized block's real cost."""
    from transformers import AutoConfig

    # SmolLM2-135M's shape (30 blocks, hidden 576), with 60 MiB to fill after the CPU reserve
    cfg = AutoConfig.for_model("llama", hidden_size=576, intermediate_size=1536,
                               num_hidden_layers=30, num_attention_heads=9,
                               num_key_value_heads=3, vocab_size=49152)  # fmt: skip
    free = ((60 << 20) + (1 << 30)) / 0.9
    counts = {}
    for quant in ("none", "int8", "nf4"):
        cap = choose_num_blocks(cfg, torch.device("cpu"), torch.float32, quant=quant,
                                cache_tokens=256, free_bytes=int(free))  # fmt: skip
        assert cap.block_bytes == block_weight_bytes(cfg, torch.float32, quant)[0]
        assert cap.cache_bytes == kv_bytes_per_token(cfg, torch.float32) * 256
        counts[quant] = cap.num_blocks
    assert counts == {"none": 4, "int8": 15, "nf4": 28}  # 13.9, 3.8, 2.1 MiB per block
    print(f"\nblocks in 60 MiB: {counts}")
