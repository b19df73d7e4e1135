"""Tiny checkpoints split into two spans, with the full transformers model beside them.

`Tiny` bundles what span tests compare: the checkpoint, the reference model, the client head
and two ModelSpans split where each family's layers change kind (SPLITS). `make_tiny` builds
one from a saved tiny checkpoint (tests/tiny_models.py); the fixtures are in conftest.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from drift.models.checkpoint import Checkpoint
from drift.models.head import ClientHead
from drift.models.registry import get_adapter
from drift.models.span import ModelSpan
from tests.tiny_models import FAMILIES

# Where each family's two test spans split: across a sliding/full or dense/MoE boundary.
SPLITS: dict[str, int] = {
    "bloom": 2,
    "deepseek_v3": 1,  # [0,1) dense | [1,4): dense 1, MoE 2-3 (first_k_dense_replace=2)
    "falcon": 2,
    "falcon_alibi": 2,
    "gemma2": 1,  # sliding | full, sliding, full
    "gemma3_text": 3,  # s s f | s s f
    "llama": 2,
    "mistral": 2,
    "mixtral": 2,
    "qwen2": 2,
    "qwen3": 2,
    "qwen3_moe": 1,  # dense 0 | MoE 1, dense 2, MoE 3
}
assert sorted(SPLITS) == FAMILIES


@dataclass
class Tiny:
    family: str
    ckpt: Checkpoint
    reference: torch.nn.Module  # the full transformers model, float32, same weights
    head: ClientHead
    spans: tuple[ModelSpan, ModelSpan]
    split: int
    # Logit tolerance of batched/padded runs against per-sequence runs: 1e-5 on tiny models;
    # a real model's larger activations leave float32 reduction-order noise of a few 1e-5.
    batch_tol: float = 1e-5

    @property
    def num_layers(self) -> int:
        return int(self.reference.config.num_hidden_layers)


def make_tiny(family: str, directory: Path) -> Tiny:
    ckpt = Checkpoint(directory)
    adapter = get_adapter(ckpt.config)
    reference = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation=adapter.attn_implementation
    ).eval()
    split, n = SPLITS[family], adapter.num_layers
    spans = (ModelSpan.load(ckpt, 0, split), ModelSpan.load(ckpt, split, n))
    return Tiny(family, ckpt, reference, ClientHead.load(ckpt), spans, split)
