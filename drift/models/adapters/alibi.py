"""Falcon and Bloom: `transformer.h.{i}` blocks that take `layer_past=` and return tuples.

ALiBi biases come from the 2D mask over past + current tokens (trap 6), so sessions keep
that mask; falcon without ALiBi uses rotary like llama. Bloom runs eager attention and
normalises embeddings on the client (`word_embeddings_layernorm`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from drift.models.adapters.base import Adapter, RunContext, build_masks, register


class _TransformerH(Adapter):
    layer_prefix: ClassVar[str] = "transformer.h.{i}."
    embed_name: ClassVar[str] = "transformer.word_embeddings.weight"
    norm_prefix: ClassVar[str] = "transformer.ln_f."

    def build_final_norm(self) -> torch.nn.Module:
        return torch.nn.LayerNorm(self.hidden_size, eps=self.config.layer_norm_epsilon)

    @property
    def num_heads(self) -> int:
        return int(self.config.num_attention_heads)

    def alibi(self, ctx: RunContext, dtype: torch.dtype) -> torch.Tensor:
        """[B * heads, 1, past + T] ALiBi biases from the 2D mask (the model's own helper)."""
        return self.alibi_from_mask(ctx.mask_2d, dtype)

    def alibi_from_mask(self, mask_2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[B * heads, 1, S] ALiBi biases of a [B, S] mask of past + current tokens."""
        return self.modeling.build_alibi_tensor(mask_2d, self.num_heads, dtype=dtype)

    def alibi_divisor(self) -> float:
        """What the family divides its ALiBi biases by before adding them to q.k * scale:
        Falcon sqrt(head_dim) (FalconModel.forward), Bloom 1 (added to the scaled logits)."""
        return 1.0


@register("falcon")
class FalconAdapter(_TransformerH):
    def build_aux(self) -> torch.nn.Module:
        aux = torch.nn.Module()
        aux.rotary_emb = self.model_class("RotaryEmbedding")(config=self.config)
        return aux

    def prepare(self, aux: torch.nn.Module, hidden: torch.Tensor, ctx: RunContext) -> Any:
        first = {"full_attention": ctx.layer_ids[0]}
        mask = build_masks(self.config, first, hidden, ctx, allow_is_causal_skip=False)[
            "full_attention"
        ]
        alibi = None
        if self.config.alibi:
            alibi = self.alibi(ctx, hidden.dtype)
            if mask is not None and mask.ndim == 4:
                mask = self._merge_alibi(mask, alibi, hidden)
        rotary = aux.get_submodule("rotary_emb")(hidden, position_ids=ctx.position_ids)
        return mask, alibi, rotary

    def _merge_alibi(
        self, mask: torch.Tensor, alibi: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """As FalconModel.forward: the scaled ALiBi bias becomes the additive mask."""
        min_dtype = torch.finfo(hidden.dtype).min
        if mask.dtype == torch.bool:
            zero = torch.full((), 0.0, device=mask.device, dtype=hidden.dtype)
            mask = torch.where(mask, zero, min_dtype)
        alibi = alibi.reshape(hidden.shape[0], -1, *alibi.shape[1:])  # [B, heads, 1, S]
        scaled = alibi / self.alibi_divisor()
        return torch.masked_fill(scaled, mask < -1, min_dtype)

    def alibi_divisor(self) -> float:
        return math.sqrt(self.hidden_size // self.num_heads)

    def call_layer(
        self, layer: torch.nn.Module, index: int, hidden: torch.Tensor, prep: Any, ctx: RunContext
    ) -> torch.Tensor:
        mask, alibi, rotary = prep
        out = layer(
            hidden,
            layer_past=ctx.cache,
            attention_mask=mask,
            position_ids=ctx.position_ids,
            use_cache=ctx.cache is not None,
            alibi=alibi,
            position_embeddings=rotary,
        )
        return out[0]


@register("bloom")
class BloomAdapter(_TransformerH):
    attn_implementation: ClassVar[str] = "eager"
    embed_norm_prefix: ClassVar[str | None] = "transformer.word_embeddings_layernorm."

    @property
    def num_heads(self) -> int:
        return int(self.config.n_head)

    def build_embed_norm(self) -> torch.nn.Module | None:
        return torch.nn.LayerNorm(self.hidden_size, eps=self.config.layer_norm_epsilon)

    def prepare(self, aux: torch.nn.Module, hidden: torch.Tensor, ctx: RunContext) -> Any:
        first = {"full_attention": ctx.layer_ids[0]}
        mask = build_masks(self.config, first, hidden, ctx)["full_attention"]
        return mask, self.alibi(ctx, hidden.dtype)

    def call_layer(
        self, layer: torch.nn.Module, index: int, hidden: torch.Tensor, prep: Any, ctx: RunContext
    ) -> torch.Tensor:
        mask, alibi = prep
        out = layer(
            hidden,
            alibi=alibi,
            attention_mask=mask,
            layer_past=ctx.cache,
            use_cache=ctx.cache is not None,
        )
        return out[0]
