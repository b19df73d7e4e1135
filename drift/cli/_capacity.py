"""How many blocks fit on this machine: free memory / (block weights + the KV cache it reserves).

Counts a block's parameters from the config on the meta device (no weights read), prices
them at the chosen dtype or quantization, and adds the KV cache each block reserves for
`cache_tokens` tokens. Knows nothing about which blocks to serve or how to serve them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from drift.wire.errors import BadRequest

# Bytes per parameter for each quantization (nf4 keeps a scale per 64 weights).
QUANT_BYTES: dict[str, float] = {"int8": 1.0 + 4 / 64, "nf4": 0.5 + 4 / 64}
CPU_RESERVE_BYTES = 1 << 30  # left for the OS, the Python process and activations
ACCEL_RESERVE_BYTES = 512 << 20  # activations, allocator slack, CUDA context
USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Capacity:
    """The arithmetic behind a block count, for the startup message."""

    num_blocks: int  # blocks that fit, capped at the model's block count
    free_bytes: int  # free memory found on the device
    block_bytes: int  # weights of one block at the chosen dtype / quantization
    cache_bytes: int  # KV cache one block reserves

    def explain(self) -> str:
        return (
            f"{self.num_blocks} blocks fit: {_gib(self.free_bytes)} free, "
            f"{_mib(self.block_bytes)} weights + {_mib(self.cache_bytes)} KV cache per block"
        )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def free_memory(device: torch.device) -> int:
    """Free bytes on `device`: the accelerator's free memory, or MemAvailable on the CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "xpu" and hasattr(torch.xpu, "mem_get_info"):
        free, _total = torch.xpu.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def params_per_block(config) -> int:
    """Parameters of the largest decoder block, counted on the meta device."""
    from transformers import AutoModelForCausalLM

    num_layers = int(config.num_hidden_layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    lists = [
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == num_layers
    ]
    if not lists:
        raise BadRequest(f"cannot find the {num_layers} decoder blocks of {config.model_type}")
    return max(sum(p.numel() for p in layer.parameters()) for layer in lists[0])


def kv_values_per_token(config) -> int:
    """Key + value numbers one block stores per cached token."""
    text = getattr(config, "text_config", None) or config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return 2 * kv_heads * head_dim


def bytes_per_param(dtype: torch.dtype, quant: str = "none") -> float:
    if quant in ("none", None):
        return float(torch.finfo(dtype).bits // 8)
    if quant not in QUANT_BYTES:
        raise BadRequest(f"unknown quantization {quant!r}; use none, {', '.join(QUANT_BYTES)}")
    return QUANT_BYTES[quant]


def blocks_that_fit(
    *, free_bytes: int, block_bytes: int, cache_bytes: int, total_blocks: int, reserve_bytes: int
) -> int:
    """floor((free * 0.9 - reserve) / (block + cache)), capped at `total_blocks`; 0 if none fit."""
    usable = int(free_bytes * USABLE_FRACTION) - reserve_bytes
    per_block = block_bytes + cache_bytes
    if per_block <= 0:
        raise BadRequest("a block must take some memory")
    return max(0, min(total_blocks, usable // per_block))


def choose_num_blocks(
    config, device: torch.device, dtype: torch.dtype, *, quant: str = "none", cache_tokens: int
) -> Capacity:
    """How many of the model's blocks this device can serve, with the numbers behind it."""
    free = free_memory(device)
    block = int(params_per_block(config) * bytes_per_param(dtype, quant))
    cache = kv_values_per_token(config) * cache_tokens * (torch.finfo(dtype).bits // 8)
    reserve = CPU_RESERVE_BYTES if device.type == "cpu" else ACCEL_RESERVE_BYTES
    total = int(config.num_hidden_layers)
    n = blocks_that_fit(
        free_bytes=free,
        block_bytes=block,
        cache_bytes=cache,
        total_blocks=total,
        reserve_bytes=reserve,
    )
    capacity = Capacity(n, free, block, cache)
    if n == 0:
        raise BadRequest(
            f"not even one block fits on {device}: {capacity.explain()}. Free some memory, use "
            "--quant_type int8/nf4, a smaller --torch_dtype or --attn_cache_tokens, or pass "
            "--num_blocks explicitly"
        )
    return capacity
