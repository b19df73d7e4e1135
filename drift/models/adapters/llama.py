"""Llama-like families: one mask per layer type, one shared rotary, layers return a tensor.

Covers llama, qwen2, qwen3 (per-layer `layer_types`), mistral, mixtral, qwen3_moe (the
sliding mask on every layer when `sliding_window` is set: trap 4) and deepseek_v3 (multi-head
latent attention and dense-vs-MoE by absolute layer_idx live inside the model's own layers).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from drift.models.adapters.base import (
    Adapter,
    RunContext,
    build_masks,
    first_of_each_type,
    register,
)
from drift.models.attention import DRIFT_SDPA, AfterPast


@register("llama", "qwen2", "qwen3", "deepseek_v3")
class LlamaLikeAdapter(Adapter):
    """Layers called as layer(h, attention_mask=, position_embeddings=, position_ids=, cache=)."""

    attn_implementation: ClassVar[str] = DRIFT_SDPA  # SDPA, and chunks after a past maskless

    def build_aux(self) -> torch.nn.Module:
        aux = torch.nn.Module()
        aux.rotary_emb = self.model_class("RotaryEmbedding")(config=self.config)
        return aux

    def prepare(self, aux: torch.nn.Module, hidden: torch.Tensor, ctx: RunContext) -> Any:
        kinds = first_of_each_type(self, ctx.layer_ids)
        takes = self.attn_implementation == DRIFT_SDPA and "full_attention" in kinds
        after = after_past(hidden, ctx) if takes else None
        if after is not None:  # drift.models.attention: no [T, past + T] mask to build or read
            kinds.pop("full_attention")
        masks = build_masks(self.config, kinds, hidden, ctx)
        if after is not None:
            masks["full_attention"] = after
        rotary = aux.get_submodule("rotary_emb")(hidden, ctx.position_ids)
        return masks, rotary

    def call_layer(
        self, layer: torch.nn.Module, index: int, hidden: torch.Tensor, prep: Any, ctx: RunContext
    ) -> torch.Tensor:
        masks, rotary = prep
        return layer(
            hidden,
            attention_mask=masks[self.layer_type(index)],
            position_embeddings=rotary,
            position_ids=ctx.position_ids,
            cache=ctx.cache,
            use_cache=ctx.cache is not None,
        )


@register("mistral", "mixtral", "qwen3_moe")
class MistralLikeAdapter(LlamaLikeAdapter):
    """Same calling convention; the model picks the mask from `sliding_window` alone."""

    def layer_type(self, index: int) -> str:
        if getattr(self.config, "sliding_window", None) is not None:
            return "sliding_attention"
        return "full_attention"


def after_past(hidden: torch.Tensor, ctx: RunContext) -> AfterPast | None:
    """The mask of a prompt chunk after a cached past with no padding, on the CPU, as the
    sentinel drift.models.attention takes; None where transformers' mask is needed."""
    tokens = int(hidden.shape[1])
    past = int(ctx.mask_2d.shape[1]) - tokens
    if (tokens < 2 or past < 1 or ctx.cache is None or hidden.device.type != "cpu"
            or not bool(ctx.mask_2d.all())):  # fmt: skip
        return None
    return AfterPast(past, tokens)
