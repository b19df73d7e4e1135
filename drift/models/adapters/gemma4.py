"""Gemma 4 text (dense, MoE, Unified with k=v full layers), also the text tower of the
multimodal `gemma4` / `gemma4_unified` checkpoints (their vision and audio are never read).

Its blocks take a per-layer input (computed by the client from the token ids: PerLayerInputs)
and its last blocks reuse the keys/values of a donor block (drift.models.sharing): a span
receives what its consumers read from donors before it (`kv.<donor>.k/v`, kept in a session
under the donor's cache slot, so each step ships only new positions) and gives back what it
donates to blocks after it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from transformers.cache_utils import KVSharingDict

from drift.models.adapters.base import Adapter, RunContext, build_masks, register
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.extras import PER_LAYER_INPUTS, ExtraSpec, Shape, kv_names


@register("gemma4_text", "gemma4_unified_text")
class Gemma4Adapter(Adapter):
    """Layers called as layer(h, [per_layer_input,] shared_kv_states=, position_embeddings=,
    attention_mask=, position_ids=, cache=)."""

    text_prefix: ClassVar[str] = "model."  # the text model's own tensors (canonical names)
    layer_prefix: ClassVar[str] = "model.layers.{i}."
    embed_name: ClassVar[str] = "model.embed_tokens.weight"
    norm_prefix: ClassVar[str] = "model.norm."

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if getattr(self.config, "use_bidirectional_attention", None) == "all":
            raise BadRequest("Gemma 4 with use_bidirectional_attention='all' is not a causal LM")
        self.per_layer = int(getattr(self.config, "hidden_size_per_layer_input", 0) or 0)

    # --- structure -------------------------------------------------------------------------
    def build_aux(self) -> nn.Module:
        aux = nn.Module()
        aux.rotary_emb = self.model_class("TextRotaryEmbedding")(config=self.config)
        return aux

    def kv_shape(self, block: int) -> Shape:
        """[B, kv heads, T, head dim] of the keys (and of the values) block `block` computes."""
        layer = self.config.per_layer_config[block]
        return ("B", int(layer.num_key_value_heads), "T", int(layer.head_dim))

    def extra_spec(self, start: int, end: int) -> ExtraSpec:
        inputs: list[tuple[str, Shape]] = []
        if self.per_layer:
            inputs.append((PER_LAYER_INPUTS, ("B", "T", end - start, self.per_layer)))
        for donor in self.sharing.consumed(start, end):
            inputs += [(name, self.kv_shape(donor)) for name in kv_names(donor)]
        donors = self.sharing.donated(start, end, self.num_layers)
        return ExtraSpec(tuple(inputs), tuple((d, self.kv_shape(d)) for d in donors))

    # --- running ---------------------------------------------------------------------------
    def prepare(self, aux: nn.Module, hidden: torch.Tensor, ctx: RunContext) -> Any:
        """Masks (sized from each type's cache slot), rotary per type, and the shared K/V."""
        slots: dict[str, int] = {}
        for index in ctx.layer_ids:
            slots.setdefault(self.layer_type(index), self.sharing.cache_slot(index))
        masks = build_masks(self.config, slots, hidden, ctx)
        rotary_emb = aux.get_submodule("rotary_emb")
        rotary = {kind: rotary_emb(hidden, ctx.position_ids, kind) for kind in slots}
        shared = KVSharingDict()
        extras = ctx.extras or {}
        for donor in self.sharing.consumed(ctx.layer_ids[0], ctx.layer_ids[-1] + 1):
            keys, values = (extras[name] for name in kv_names(donor))
            if ctx.cache is not None:  # kept under the donor's slot: past + these positions
                keys, values = ctx.cache.update(keys, values, donor)
            shared[self.layer_type(donor)] = keys, values
        return masks, rotary, shared

    def call_layer(
        self, layer: nn.Module, index: int, hidden: torch.Tensor, prep: Any, ctx: RunContext
    ) -> torch.Tensor:
        masks, rotary, shared = prep
        kind = self.layer_type(index)
        per_layer: dict[str, Any] = {}
        if self.per_layer:
            slot = index - ctx.layer_ids[0]
            per_layer["per_layer_input"] = (ctx.extras or {})[PER_LAYER_INPUTS][:, :, slot]
        return layer(
            hidden,
            shared_kv_states=shared,
            position_embeddings=rotary[kind],
            attention_mask=masks[kind],
            position_ids=ctx.position_ids,
            cache=ctx.cache,
            **per_layer,
        )

    def donated(
        self, prep: Any, ctx: RunContext, donate: tuple[int, ...], tokens: int
    ) -> dict[str, torch.Tensor]:
        """The donors' keys/values [B, heads, T, D] of the new tokens only: a consuming
        session keeps the past positions it received before."""
        shared = prep[2]
        out: dict[str, torch.Tensor] = {}
        for donor in donate:
            k_name, v_name = kv_names(donor)
            keys, values = shared[self.layer_type(donor)]
            out[k_name], out[v_name] = keys[:, :, -tokens:], values[:, :, -tokens:]
        return out

    # --- client head -----------------------------------------------------------------------
    def build_final_norm(self) -> nn.Module:
        return self.model_class("RMSNorm")(self.hidden_size, eps=self.config.rms_norm_eps)

    def embed_scale(self) -> float | None:
        return float(self.config.hidden_size) ** 0.5

    def logit_softcap(self) -> float | None:
        cap = getattr(self.config, "final_logit_softcapping", None)
        return float(cap) if cap else None

    def build_per_layer(self) -> tuple[nn.Module, str] | None:
        if not self.per_layer:
            return None
        norm = self.model_class("RMSNorm")(self.per_layer, eps=self.config.rms_norm_eps)
        return PerLayerInputs(self.config, norm), self.text_prefix


@register("gemma4", "gemma4_unified")
class Gemma4MultimodalAdapter(Gemma4Adapter):
    """The text tower of a multimodal checkpoint: its text config (its tensors are found
    under the tower by the checkpoint's layout, drift.models.layout)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config.get_text_config())
        names = ("image_token_id", "video_token_id", "audio_token_id")
        self._placeholders = tuple(
            int(v) for v in (getattr(config, n, None) for n in names) if v is not None
        )

    def placeholder_ids(self) -> tuple[int, ...]:
        """As Gemma4Model: these ids enter the text tower (embeddings and per-layer inputs) as
        the pad token, where image/audio features would be scattered in."""
        return self._placeholders


class PerLayerInputs(nn.Module):
    """Gemma 4's per-layer inputs [B, T, L, P] from token ids and their (scaled) embeddings:
    a token-identity table plus a projection of the embeddings, as Gemma4TextModel does."""

    def __init__(self, config: Any, norm: nn.Module) -> None:
        super().__init__()
        self.num_layers = int(config.num_hidden_layers)
        self.width = int(config.hidden_size_per_layer_input)
        size = self.num_layers * self.width
        self.embed_tokens_per_layer = nn.Embedding(int(config.vocab_size_per_layer_input), size)
        self.per_layer_model_projection = nn.Linear(int(config.hidden_size), size, bias=False)
        self.per_layer_projection_norm = norm
        self.embed_scale = float(self.width) ** 0.5
        self.projection_scale = float(config.hidden_size) ** -0.5

    def forward(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[B, T] ids, [B, T, H] embeddings -> [B, T, L, P]."""
        table = self.embed_tokens_per_layer
        if bool((input_ids >= table.num_embeddings).any()):
            raise BadTensor(f"per-layer inputs exist for token ids < {table.num_embeddings}")
        shape = (*input_ids.shape, self.num_layers, self.width)
        scale = torch.tensor(self.embed_scale, dtype=table.weight.dtype)
        identity = (table(input_ids.to(table.weight.device)) * scale).reshape(shape)
        projected = self.per_layer_model_projection(embeds) * self.projection_scale
        projected = self.per_layer_projection_norm(projected.reshape(shape))
        return (projected + identity.to(projected.dtype)) * 2.0**-0.5
