"""Tiny random multimodal checkpoints saved by transformers' own `save_pretrained`: Gemma 3,
Gemma 4 (vision, no audio) and Mistral 3, as `*ForConditionalGeneration` writes them (text
tower under `model.language_model.`). Their text towers reuse tests/tiny_models' configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
)

from tests.tiny_models import _GEMMA4_PLE, _GEMMA4_TEXT, TINY_CONFIGS

_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def _text(family: str) -> dict[str, Any]:
    params = dict(TINY_CONFIGS[family])
    params.pop("model_type")
    return params


def gemma3_config() -> Gemma3Config:
    vision = dict(_VISION, image_size=32, patch_size=8)
    return Gemma3Config(text_config=_text("gemma3_text"), vision_config=vision,
                        mm_tokens_per_image=4, image_token_index=250, boi_token_index=251,
                        eoi_token_index=252)  # fmt: skip


def gemma4_config() -> Gemma4Config:
    vision = dict(_VISION, num_key_value_heads=2, head_dim=16)
    return Gemma4Config(text_config=dict(**_GEMMA4_TEXT, **_GEMMA4_PLE), vision_config=vision,
                        audio_config=None, image_token_id=250, video_token_id=251,
                        boi_token_id=253, eoi_token_id=254)  # fmt: skip


def mistral3_config() -> Mistral3Config:
    text = dict(_text("mistral"), model_type="mistral")
    vision = dict(_VISION, model_type="pixtral", image_size=32, patch_size=8, head_dim=16)
    return Mistral3Config(text_config=text, vision_config=vision, image_token_index=250,
                          spatial_merge_size=1)  # fmt: skip


MULTIMODAL = {
    "gemma3": (gemma3_config, Gemma3ForConditionalGeneration),
    "gemma4": (gemma4_config, Gemma4ForConditionalGeneration),
    "mistral3": (mistral3_config, Mistral3ForConditionalGeneration),
}


def save_multimodal(family: str, directory: Path, seed: int = 0) -> Path:
    """The tiny `family` *ForConditionalGeneration, weights perturbed, saved by transformers."""
    make_config, cls = MULTIMODAL[family]
    torch.manual_seed(seed)
    model = cls(make_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def load_local(family: str, directory: Path) -> torch.nn.Module:
    """The same checkpoint as transformers loads it: the full multimodal model, float32."""
    return MULTIMODAL[family][1].from_pretrained(directory, dtype=torch.float32).eval()
