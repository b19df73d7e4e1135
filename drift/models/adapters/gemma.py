"""Gemma 2 and Gemma 3 text: alternating sliding/full layers, scaled embeddings on the client.

gemma2 runs eager attention (its logit softcapping has no sdpa path) and caps final logits;
gemma3_text computes one rotary per layer type with `rotary_emb(h, positions, layer_type)`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from drift.models.adapters.base import RunContext, build_masks, first_of_each_type, register
from drift.models.adapters.llama import LlamaLikeAdapter
from drift.wire.errors import BadRequest


class _GemmaBase(LlamaLikeAdapter):
    attn_implementation: ClassVar[str] = "sdpa"  # transformers' masks for every chunk

    def embed_scale(self) -> float | None:
        return float(self.config.hidden_size) ** 0.5

    def call_layer(
        self, layer: torch.nn.Module, index: int, hidden: torch.Tensor, prep: Any, ctx: RunContext
    ) -> torch.Tensor:
        masks, rotary = prep
        kind = self.layer_type(index)
        return layer(
            hidden,
            attention_mask=masks[kind],
            position_embeddings=rotary[kind] if isinstance(rotary, dict) else rotary,
            position_ids=ctx.position_ids,
            cache=ctx.cache,
        )


@register("gemma2")
class Gemma2Adapter(_GemmaBase):
    attn_implementation: ClassVar[str] = "eager"

    def logit_softcap(self) -> float | None:
        cap = getattr(self.config, "final_logit_softcapping", None)
        return float(cap) if cap else None


@register("gemma3_text")
class Gemma3Adapter(_GemmaBase):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if getattr(self.config, "use_bidirectional_attention", False):
            raise BadRequest("gemma3_text with use_bidirectional_attention is not a causal LM")

    def logit_softcap(self) -> float | None:
        cap = getattr(self.config, "final_logit_softcapping", None)
        return float(cap) if cap else None

    def prepare(self, aux: torch.nn.Module, hidden: torch.Tensor, ctx: RunContext) -> Any:
        kinds = first_of_each_type(self, ctx.layer_ids)
        masks = build_masks(self.config, kinds, hidden, ctx)
        rotary_emb = aux.get_submodule("rotary_emb")
        rotary = {kind: rotary_emb(hidden, ctx.position_ids, kind) for kind in kinds}
        return masks, rotary
