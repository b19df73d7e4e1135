"""A session's KV cache: built from the config, reordered for beams, rolled back by position.

Sliding-window layers record their whole past (`activate_past_recording`) so a session can
roll back any number of tokens, not only inside the window; the attention still sees only
the window. Cache slots of layers outside the span stay empty and cost nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DummyLayer, DynamicSlidingWindowLayer


def new_cache(config: Any) -> DynamicCache:
    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer):  # the layers with is_sliding set
            layer.activate_past_recording()
    return cache


def cache_length(cache: DynamicCache, first_layer: int) -> int:
    """Tokens seen by the span (trap 1: read the span's own first layer, not layer 0)."""
    return int(cache.get_seq_length(first_layer))


def _filled_layers(
    cache: DynamicCache,
) -> Iterator[tuple[CacheLayerMixin, torch.Tensor, torch.Tensor]]:
    """Each layer holding cached tokens, with its keys and values (empty layers skipped, and
    the dummies of blocks that read another block's keys/values: Gemma 4)."""
    for layer in cache.layers:
        if isinstance(layer, DummyLayer):
            continue
        if not isinstance(layer, CacheLayerMixin):
            raise TypeError(f"{type(layer).__name__} holds no key/value cache to reorder or trim")
        keys, values = layer.keys, layer.values
        if layer.is_initialized and keys is not None and values is not None and keys.numel() > 0:
            yield layer, keys, values


def reorder(cache: DynamicCache, hypo_ids: torch.Tensor) -> None:
    for layer, keys, _ in _filled_layers(cache):
        layer.reorder_cache(cast(torch.LongTensor, hypo_ids.to(keys.device)))


def rollback(cache: DynamicCache, keep: int) -> None:
    """Drop every cached token at position >= keep."""
    for layer, keys, values in _filled_layers(cache):
        seen = int(layer.get_seq_length())
        if seen <= keep:
            continue
        stored = keys.shape[-2]  # == seen: sliding layers record their whole past
        end = stored - (seen - keep)
        layer.keys = keys[..., :end, :]
        layer.values = values[..., :end, :]
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = keep


def fork_prefix(src: DynamicCache, dst: DynamicCache, layer_ids: tuple[int, ...], tokens: int,
                rows: int) -> None:  # fmt: skip
    """Fill `dst`'s layers `layer_ids` (empty) with the first `tokens` keys and values of
    `src`'s one row, repeated in each of `rows` rows (copies: the two caches stay apart)."""
    for index in layer_ids:
        source, target = src.layers[index], dst.layers[index]
        if isinstance(source, DummyLayer) or not isinstance(source, CacheLayerMixin):
            raise TypeError(f"{type(source).__name__} holds no key/value cache to fork")
        if isinstance(target, DummyLayer) or not isinstance(target, CacheLayerMixin):
            raise TypeError(f"{type(target).__name__} holds no key/value cache to fork")
        keys, values = source.keys, source.values
        if not source.is_initialized or keys is None or values is None:
            raise ValueError(f"layer {index} holds no tokens to fork")
        if keys.shape[0] != 1 or keys.shape[-2] != int(source.get_seq_length()):
            raise ValueError(f"layer {index} does not hold one row's whole past")

        def rows_of(t: torch.Tensor) -> torch.Tensor:
            part = t[..., :tokens, :]
            return part.expand(rows, *part.shape[1:]).contiguous()

        target.update(rows_of(keys), rows_of(values))
