"""The adapter contract: how one architecture family builds and runs its decoder layers.

An adapter knows the checkpoint prefix of layer i, builds layer i on `meta` with its absolute
`layer_idx`, and runs one layer given what `prepare` computed once per call (masks, rotary).
It does not know about sessions, prompts or weights on disk: drift.models.span drives it.
Families register themselves here with `@register(...)`; drift.models.registry looks them up.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import torch
from transformers import AutoModelForCausalLM, Cache, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from drift.models.sharing import KVSharing
from drift.wire.errors import BadRequest
from drift.wire.extras import NO_EXTRAS, ExtraSpec

A = TypeVar("A", bound="type[Adapter]")

# Filled by the @register decorators when a family module is imported (import-time,
# append-only: the registry pattern of petals' auto_config, not mutable runtime state).
ADAPTERS: dict[str, type[Adapter]] = {}


def register(*model_types: str) -> Any:
    """Class decorator: serve `model_types` with the decorated adapter class."""

    def wrap(cls: A) -> A:
        for model_type in model_types:
            if model_type in ADAPTERS and ADAPTERS[model_type] is not cls:
                raise ValueError(f"model_type {model_type!r} is registered twice")
            ADAPTERS[model_type] = cls
        return cls

    return wrap


MASK_FUNCTIONS = {
    "full_attention": create_causal_mask,
    "sliding_attention": create_sliding_window_causal_mask,
}


@dataclass(frozen=True)
class RunContext:
    """What one call over a list of layers needs besides the hidden states."""

    layer_ids: tuple[int, ...]  # absolute indices of the layers to run, in order
    mask_2d: torch.Tensor  # [B, past + T] 1 = token, 0 = left padding
    position_ids: torch.Tensor  # [B, T] positions of the new tokens (from the mask's cumsum)
    cache: Cache | None  # the session's cache, or None for a stateless pass
    extras: Mapping[str, torch.Tensor] | None = None  # named inputs beside hidden (Gemma 4)


class Adapter:
    """Base adapter: finds the family's own classes from the `*ForCausalLM` of the config."""

    layer_prefix: ClassVar[str] = "model.layers.{i}."
    attn_implementation: ClassVar[str] = "sdpa"

    def __init__(self, config: Any) -> None:
        config = copy.deepcopy(config)
        config._attn_implementation = self.attn_implementation
        self.config = config
        try:
            # transformers' stub types the lazy mapping's values as tuples; they are classes.
            lm_class = cast(
                type[PreTrainedModel], AutoModelForCausalLM._model_mapping[type(config)]
            )
        except KeyError as exc:
            raise BadRequest(f"transformers has no causal LM for {config.model_type!r}") from exc
        self.modeling = sys.modules[lm_class.__module__]
        self.family = lm_class.__name__.removesuffix("ForCausalLM")
        no_split = lm_class._no_split_modules
        if not isinstance(no_split, list) or not no_split:
            raise BadRequest(f"transformers' {lm_class.__name__} names no decoder layer class")
        self.layer_class = getattr(self.modeling, no_split[0])
        if getattr(config, "_experts_implementation", None) is None:
            # What from_pretrained picks for MoE layers: grouped_mm where the model allows it.
            can_set = getattr(lm_class, "_can_set_experts_implementation", lambda: False)
            config._experts_implementation = "grouped_mm" if can_set() else "eager"
        self.sharing = KVSharing.from_config(config)  # empty unless blocks reuse others' K/V

    # --- structure -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def model_class(self, suffix: str) -> Any:
        """The family's own class `<Family><suffix>`, e.g. LlamaRotaryEmbedding."""
        return getattr(self.modeling, self.family + suffix)

    def build_layer(self, index: int) -> torch.nn.Module:
        """Layer `index` on the meta device, with its absolute layer_idx."""
        with torch.device("meta"):
            return self.layer_class(self.config, layer_idx=index)

    def build_aux(self) -> torch.nn.Module:
        """Parameter-free modules shared by the layers (rotary embeddings); on the cpu."""
        return torch.nn.Module()

    def layer_type(self, index: int) -> str:
        layer_types = getattr(self.config, "layer_types", None)
        return str(layer_types[index]) if layer_types else "full_attention"

    def extra_spec(self, start: int, end: int) -> ExtraSpec:
        """The named tensors blocks [start, end) take and can give beside hidden states."""
        return NO_EXTRAS

    # --- running ---------------------------------------------------------------------------
    def prepare(self, aux: torch.nn.Module, hidden: torch.Tensor, ctx: RunContext) -> Any:
        """Everything computed once per call for all layers (masks, rotary)."""
        raise NotImplementedError

    def call_layer(
        self, layer: torch.nn.Module, index: int, hidden: torch.Tensor, prep: Any, ctx: RunContext
    ) -> torch.Tensor:
        raise NotImplementedError

    def donated(
        self, prep: Any, ctx: RunContext, donate: tuple[int, ...], tokens: int
    ) -> dict[str, torch.Tensor]:
        """After the layers ran: the keys/values of the `donate` blocks for the new tokens."""
        assert not donate, f"{type(self).__name__} shares no keys/values"
        return {}

    # --- client head -----------------------------------------------------------------------
    embed_name: ClassVar[str] = "model.embed_tokens.weight"
    norm_prefix: ClassVar[str] = "model.norm."
    embed_norm_prefix: ClassVar[str | None] = None

    def build_final_norm(self) -> torch.nn.Module:
        return self.model_class("RMSNorm")(self.hidden_size, eps=self.config.rms_norm_eps)

    def build_embed_norm(self) -> torch.nn.Module | None:
        return None

    def placeholder_ids(self) -> tuple[int, ...]:
        """Token ids the text tower embeds as the pad token: a multimodal checkpoint's image,
        audio and video stand-ins (DRIFT serves the text tower only)."""
        return ()

    def build_per_layer(self) -> tuple[torch.nn.Module, str] | None:
        """(module computing per-layer inputs from ids and embeddings, its checkpoint prefix)."""
        return None

    def embed_scale(self) -> float | None:
        return None

    def logit_softcap(self) -> float | None:
        return None


def build_masks(
    config: Any, kinds: dict[str, int], hidden: torch.Tensor, ctx: RunContext, **extra: Any
) -> dict[str, Any]:
    """One mask per layer type, sized from the cache at the span's first layer of that type.

    `kinds` maps a layer type to the absolute index of its first layer in this run (trap 2:
    the helpers' default index is the model's first layer, empty in a span's cache).
    """
    masks: dict[str, Any] = {}
    for kind, first in kinds.items():
        if kind not in MASK_FUNCTIONS:
            raise BadRequest(f"layer type {kind!r} is not supported")
        masks[kind] = MASK_FUNCTIONS[kind](
            config=config,
            inputs_embeds=hidden,
            attention_mask=ctx.mask_2d,
            cache=ctx.cache,
            position_ids=ctx.position_ids,
            layer_idx=first if ctx.cache is not None else None,
            **extra,
        )
    return masks


def first_of_each_type(adapter: Adapter, layer_ids: tuple[int, ...]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for index in layer_ids:
        kinds.setdefault(adapter.layer_type(index), index)
    return kinds
