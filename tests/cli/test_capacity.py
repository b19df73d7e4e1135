"""The memory-based block count of `drift up`: arithmetic over drift.models.footprint prices."""

from __future__ import annotations

import pytest
import torch

from drift.cli._capacity import (
    CPU_HEADROOM_BYTES,
    blocks_that_fit,
    choose_num_blocks,
    free_memory,
)
from drift.models.footprint import block_weight_bytes, kv_bytes_per_token
from drift.wire.errors import BadRequest
from tests.tiny_models import tiny_config


def test_blocks_that_fit_arithmetic():
    n = blocks_that_fit(
        free_bytes=10_000, block_bytes=1000, cache_bytes=500, total_blocks=30, reserve_bytes=1000
    )
    assert n == (10_000 - 1000) // 1500 == 6
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
    assert cap.budget is not None and cap.free_bytes == cap.budget.available
    assert cap.free_bytes <= free_memory(torch.device("cpu")) * 1.2  # the host is one figure
    assert cap.headroom_bytes == CPU_HEADROOM_BYTES and cap.base_bytes
    assert cap.cache_bytes == 64 * 1024 * 4
    assert cap.block_bytes == max(block_weight_bytes(cfg, torch.float32))
    assert "blocks fit" in cap.explain() and "budget" in cap.explain()
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
    free = (60 << 20) + CPU_HEADROOM_BYTES
    counts = {}
    for quant in ("none", "int8", "nf4"):
        cap = choose_num_blocks(cfg, torch.device("cpu"), torch.float32, quant=quant,
                                cache_tokens=256, free_bytes=int(free))  # fmt: skip
        assert cap.block_bytes == block_weight_bytes(cfg, torch.float32, quant)[0]
        assert cap.cache_bytes == kv_bytes_per_token(cfg, torch.float32) * 256
        counts[quant] = cap.num_blocks
    assert counts == {"none": 4, "int8": 15, "nf4": 28}  # 13.9, 3.8, 2.1 MiB per block
    print(f"\nblocks in 60 MiB: {counts}")


LLAMA_3B = dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=49152,
                tie_word_embeddings=True)  # fmt: skip
BASE = 450 << 20  # what `drift up` holds when it sizes (python, torch, the opened checkpoint)


@pytest.mark.parametrize("quant, machine, blocks", [("none", 3 << 30, 10), ("nf4", 1536 << 20, 10)])
def test_a_3b_shaped_model_on_small_machines(quant: str, machine: int, blocks: int) -> None:
    """The issue's figures: Llama-3.2-3B-shaped in bfloat16 on 3 GiB machines (10 blocks held
    with 0.7 GiB to spare when placed by hand), nf4 on 1.5 GiB; the KV cache of 8192 tokens
    per block is reserved on top."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("llama", **LLAMA_3B)
    cap = choose_num_blocks(cfg, torch.device("cpu"), torch.bfloat16, quant=quant,
                            cache_tokens=8192, free_bytes=machine - BASE)  # fmt: skip
    assert cap.cache_bytes == 32 << 20
    assert cap.num_blocks == blocks, cap.explain()
    peak = BASE + cap.num_blocks * (cap.block_bytes + cap.cache_bytes) + cap.headroom_bytes
    assert peak <= machine
    print(f"\n{quant}: {cap.explain()}")


def test_a_move_is_short_of_what_the_new_span_takes_beside_the_old():
    """drift up's balancer moves only when the new span fits beside the old one: the budget
    left (the old span already counted as used) against the new blocks' weights, KV cache and
    headroom; a machine sized full by drift up has no room for a move of the same size."""
    from drift.cli._capacity import move_shortfall

    cfg, cpu = tiny_config("llama"), torch.device("cpu")
    block = block_weight_bytes(cfg, torch.float32)[0]
    cache = kv_bytes_per_token(cfg, torch.float32) * 1024
    need = 2 * (block + cache) + CPU_HEADROOM_BYTES

    def short(free: int) -> int:
        return move_shortfall(cfg, cpu, torch.float32, quant="none", blocks=range(2, 4),
                              cache_tokens=1024, free_bytes=free)  # fmt: skip

    assert short(need) == 0 and short(need + 1) == 0
    assert short(need - 1) == 1
    assert short(0) == need
    # sized full: what is left after drift up loaded as many blocks as fit holds no other two
    cap = choose_num_blocks(cfg, cpu, torch.float32, cache_tokens=1024,
                            free_bytes=need + 2 * (block + cache))  # fmt: skip
    assert cap.num_blocks == 4  # all four blocks fit with the headroom kept free
    left = need + 2 * (block + cache) - cap.num_blocks * (block + cache)
    assert short(left) > 0


def test_a_move_that_frees_first_is_short_only_of_what_the_new_span_costs_beyond_the_old():
    """swap_shortfall: priced as sizing prices blocks, a new span no dearer than the old fits
    on a full machine (its runtime growth lives in the headroom), a dearer one may use what is
    free beyond the headroom and no more."""
    from drift.cli._capacity import swap_shortfall

    cfg, cpu = tiny_config("llama"), torch.device("cpu")
    block = block_weight_bytes(cfg, torch.float32)[0] + kv_bytes_per_token(cfg, torch.float32) * 64

    def short(old: range, new: range, free: int) -> int:
        return swap_shortfall(cfg, cpu, torch.float32, quant="none", old_blocks=old,
                              new_blocks=new, cache_tokens=64, free_bytes=free)  # fmt: skip

    assert short(range(0, 2), range(2, 4), 0) == 0  # equal: fits with nothing free
    assert short(range(0, 2), range(3, 4), 0) == 0
    assert short(range(0, 1), range(1, 4), 0) == 2 * block
    assert short(range(0, 1), range(1, 4), CPU_HEADROOM_BYTES) == 2 * block  # the headroom stays
    assert short(range(0, 1), range(1, 4), CPU_HEADROOM_BYTES + block) == block
    assert short(range(0, 1), range(1, 4), CPU_HEADROOM_BYTES + 2 * block) == 0
