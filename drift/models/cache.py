"""A session's KV cache: built from the config, reordered for beams, rolled back by position.

Sliding-window layers record their whole past (`activate_past_recording`) so a session can
roll back any number of tokens, not only inside the window; the attention still sees only
the window. Cache slots of layers outside the span stay empty and cost nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def new_cache(config: Any) -> DynamicCache:
    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
    return cache


def cache_length(cache: DynamicCache, first_layer: int) -> int:
    """Tokens seen by the span (trap 1: read the span's own first layer, not layer 0)."""
    return int(cache.get_seq_length(first_layer))


def reorder(cache: DynamicCache, hypo_ids: torch.Tensor) -> None:
    for layer in cache.layers:
        if layer.is_initialized and layer.keys.numel() > 0:
            layer.reorder_cache(hypo_ids.to(layer.keys.device))


def rollback(cache: DynamicCache, keep: int) -> None:
    """Drop every cached token at position >= keep."""
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys.numel() == 0:
            continue
        seen = int(layer.get_seq_length())
        if seen <= keep:
            continue
        stored = layer.keys.shape[-2]  # == seen: sliding layers record their whole past
        end = stored - (seen - keep)
        layer.keys = layer.keys[..., :end, :]
        layer.values = layer.values[..., :end, :]
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = keep
