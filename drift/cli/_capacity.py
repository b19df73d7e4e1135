"""How many blocks fit on this machine: free memory / (block weights + the KV cache it reserves).

Prices a block from the config (drift.models.footprint: its layer built on the meta device,
at the chosen dtype and quantization, no weights read) and adds the KV cache each block
reserves for `cache_tokens` tokens. Knows nothing about which blocks to serve or how.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drift.wire.errors import BadRequest

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
    """Free bytes on `device`: the accelerator's free memory, else available RAM (psutil)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "xpu" and hasattr(torch.xpu, "mem_get_info"):
        free, _total = torch.xpu.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)  # Linux's MemAvailable; macOS, Windows too


def reserve_bytes(device: torch.device) -> int:
    """Memory left for the OS, the Python process and activations."""
    return CPU_RESERVE_BYTES if device.type == "cpu" else ACCEL_RESERVE_BYTES


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
    config,
    device: torch.device,
    dtype: torch.dtype,
    *,
    quant: str = "none",
    cache_tokens: int,
    free_bytes: int | None = None,
) -> Capacity:
    """How many of the model's blocks this device can serve, with the numbers behind it.

    `free_bytes`: the memory to fill (default: what is free on `device` now).
    """
    from drift.models.footprint import block_weight_bytes, kv_bytes_per_token

    free = free_memory(device) if free_bytes is None else free_bytes
    block = max(block_weight_bytes(config, dtype, quant))  # the costliest kind of block
    cache = kv_bytes_per_token(config, dtype) * cache_tokens
    reserve = reserve_bytes(device)
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
