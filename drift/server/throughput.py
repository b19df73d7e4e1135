"""How fast one block of a loaded span runs: a short benchmark, cached per device/model/dtype.

Throughput is block-tokens per second for one block (higher is faster), the unit of the
membership record. Knows nothing about HTTP or the swarm.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from drift.wire.extras import concrete

log = logging.getLogger(__name__)
CACHE_FILE = "throughput.json"


def measure_throughput(span: Any, *, tokens: int = 16, repeats: int = 3) -> float:
    """Best of `repeats` forwards of [1, tokens, H] through the span, per block."""
    hidden = torch.randn(1, tokens, int(span.config.hidden_size), dtype=span.dtype)
    n_blocks = span.end_block - span.start_block
    spec = span.extra_spec(span.start_block, span.end_block)  # Gemma 4's inputs beside hidden
    extras = {n: torch.randn(concrete(s, 1, tokens), dtype=span.dtype) for n, s in spec.inputs}
    span.forward(hidden, extras=extras)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        span.forward(hidden, extras=extras)
        best = min(best, time.perf_counter() - started)
    return tokens * n_blocks / max(best, 1e-9)


def cached_throughput(span: Any, *, key: str, cache_dir: Path | None) -> float:
    """The measurement stored under `key` in cache_dir, or a new one (then stored)."""
    path = None if cache_dir is None else Path(cache_dir) / CACHE_FILE
    table: dict[str, float] = {}
    if path is not None and path.is_file():
        try:
            loaded = json.loads(path.read_text())
            table = {k: float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            log.warning("ignoring unreadable throughput cache %s", path)
    if key in table:
        return table[key]
    value = measure_throughput(span)
    log.info("measured throughput %.1f block-tokens/s (%s)", value, key)
    if path is not None:
        table[key] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
        tmp.replace(path)
    return value


def throughput_key(device: torch.device, fingerprint: str, dtype: torch.dtype, quant: str) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name}|{fingerprint}|{dtype}|{quant}"
