"""The plain-transformers reference a block server must agree with (tiny llama-like models)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def load_reference(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def head_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Final norm + lm_head on the last block's output: [B, T, H] -> [B, T, V]."""
    return model.lm_head(model.model.norm(hidden))
