"""How many blocks fit in this machine's budget: (budget - headroom) / (block + its KV cache).

The budget is what drift.cli._budget reads (cgroup, host, accelerator, --max_memory: the
smallest), i.e. what this process may still take after its own base (interpreter, torch, the
opened checkpoint) is already counted as used. A block is priced from the config
(drift.models.footprint: its layer built on the meta device, at the chosen dtype and
quantization: what a loaded block holds) plus the KV cache it reserves for `cache_tokens`
tokens. The headroom covers whichever is larger: the runtime's growth (activations, the HTTP
server, allocator slack) or loading's transient (a quantized block is assembled in float
first); blocks load one by one, so loading never holds more than that. Knows nothing about
which blocks to serve or how.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drift.cli._budget import Budget, read_budget
from drift.wire.errors import BadRequest

CPU_RESERVE_BYTES = 1 << 30  # a whole machine planned ahead (model_table): OS + process base
CPU_HEADROOM_BYTES = 256 << 20  # runtime growth after loading: activations, HTTP, heap slack
ACCEL_HEADROOM_BYTES = 512 << 20  # activations, allocator slack on an accelerator


@dataclass(frozen=True)
class Capacity:
    """The arithmetic behind a block count, for the startup message."""

    num_blocks: int  # blocks that fit, capped at the model's block count
    free_bytes: int  # the budget: what this process may still take
    block_bytes: int  # weights of one block at the chosen dtype / quantization
    cache_bytes: int  # KV cache one block reserves
    headroom_bytes: int = 0  # kept free: runtime growth or loading's transient, the larger
    total_blocks: int = 0
    budget: Budget | None = None  # where free_bytes came from (None: given by the caller)
    base_bytes: int | None = None  # this process's resident memory when sized

    def explain(self) -> str:
        base = f"; this process holds {_gib(self.base_bytes)}" if self.base_bytes else ""
        where = f"\n  {self.budget.explain()}" if self.budget is not None else ""
        return (
            f"{self.num_blocks} of {self.total_blocks} blocks fit in {_gib(self.free_bytes)}: "
            f"{_mib(self.block_bytes)} weights + {_mib(self.cache_bytes)} KV cache per block, "
            f"{_mib(self.headroom_bytes)} headroom{base}{where}"
        )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


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


def headroom_bytes(device: torch.device, transient_bytes: int = 0) -> int:
    """Memory kept free: the runtime's growth or loading's transient, whichever is larger."""
    runtime = CPU_HEADROOM_BYTES if device.type == "cpu" else ACCEL_HEADROOM_BYTES
    return max(runtime, transient_bytes)


def blocks_that_fit(
    *, free_bytes: int, block_bytes: int, cache_bytes: int, total_blocks: int, reserve_bytes: int
) -> int:
    """floor((free - reserve) / (block + cache)), capped at `total_blocks`; 0 if none fit."""
    usable = free_bytes - reserve_bytes
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
    max_memory: int | None = None,
) -> Capacity:
    """How many of the model's blocks this device can serve, with the numbers behind it.

    `free_bytes`: the budget to fill (default: read now, drift.cli._budget, capped by
    `max_memory`, this process's whole share of the machine).
    """
    from drift.models.footprint import block_weight_bytes, kv_bytes_per_token
    from drift.models.memory import resident_bytes

    budget = None
    if free_bytes is None:
        budget = read_budget(device, max_memory=max_memory)
        free_bytes = budget.available
    block = max(block_weight_bytes(config, dtype, quant))  # the costliest kind of block
    # a quantized block is assembled in `dtype` on the CPU before it shrinks
    transient = max(block_weight_bytes(config, dtype)) if quant != "none" else 0
    cache = kv_bytes_per_token(config, dtype) * cache_tokens
    headroom = headroom_bytes(device, transient)
    total = int(config.num_hidden_layers)
    n = blocks_that_fit(free_bytes=free_bytes, block_bytes=block, cache_bytes=cache,
                        total_blocks=total, reserve_bytes=headroom)  # fmt: skip
    capacity = Capacity(n, free_bytes, block, cache, headroom, total, budget,
                        resident_bytes() if budget is not None else None)  # fmt: skip
    if n == 0:
        raise BadRequest(
            f"not even one block fits on {device}: {capacity.explain()}. Free some memory, use "
            "--quant_type int8/nf4, a smaller --torch_dtype or --attn_cache_tokens, raise "
            "--max_memory, or pass --num_blocks explicitly".replace("\n  ", "; ")
        )
    return capacity


def move_shortfall(config, device: torch.device, dtype: torch.dtype, *, quant: str,
                   blocks: range, cache_tokens: int, free_bytes: int) -> int:  # fmt: skip
    """Bytes a move is short of: loading `blocks` beside the span served now (drift.server.move
    loads the new span before it frees the old) takes their weights, KV cache and the headroom
    that sizing keeps; `free_bytes` is the budget left now. 0: the move fits."""
    from drift.models.footprint import block_weight_bytes, kv_bytes_per_token

    weights = block_weight_bytes(config, dtype, quant)
    transient = max(block_weight_bytes(config, dtype)) if quant != "none" else 0
    cache = kv_bytes_per_token(config, dtype) * cache_tokens
    need = sum(weights[b] + cache for b in blocks) + headroom_bytes(device, transient)
    return max(0, need - free_bytes)


def swap_shortfall(config, device: torch.device, dtype: torch.dtype, *, quant: str,
                   old_blocks: range, new_blocks: range, cache_tokens: int,
                   free_bytes: int) -> int:  # fmt: skip
    """Bytes a move that frees `old_blocks` before it loads `new_blocks` is short of (0: it
    fits). Priced as sizing prices blocks (weights + KV cache): the machine held the old span
    with the headroom kept, so a new span priced no higher fits, and a dearer one may use
    what is free beyond the headroom. (The runtime's growth since start-up lives in that
    headroom, so the measured free memory alone would refuse even an equal swap.)"""
    from drift.models.footprint import block_weight_bytes, kv_bytes_per_token

    weights = block_weight_bytes(config, dtype, quant)
    transient = max(block_weight_bytes(config, dtype)) if quant != "none" else 0
    cache = kv_bytes_per_token(config, dtype) * cache_tokens

    def priced(blocks: range) -> int:
        return sum(weights[b] + cache for b in blocks)

    spare = max(0, free_bytes - headroom_bytes(device, transient))
    return max(0, priced(new_blocks) - priced(old_blocks) - spare)
