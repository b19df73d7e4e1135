"""What Petals' client tests import from Petals' own server code, rebuilt on plain transformers.

`load_pretrained_block(model_dir, i)` runs decoder layer i of the local transformers model
alone, called as Petals' wrapped blocks are: `block(hidden)` -> (hidden,), and with
`use_cache=True, layer_past=...` -> (hidden, cache), where DUMMY_KEY_PAST starts a cache.
MAX_SHORT_INFERENCE_TOKENS is Petals' server constant. Rotary (llama-like) families only:
bloom's ALiBi blocks are checked through the whole model (test_petals_full_model.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.masking_utils import create_causal_mask

MAX_SHORT_INFERENCE_TOKENS = 128  # petals.server.block_functions
DUMMY_KEY_PAST = torch.empty(0)  # petals.utils.misc: "no cache yet"


class ReferenceBlock(nn.Module):
    """Layer `index` of `model` (a local *ForCausalLM) with its own positions and mask."""

    def __init__(self, model: nn.Module, index: int) -> None:
        super().__init__()
        self.model = model
        self.index = index

    def forward(self, hidden: torch.Tensor, use_cache: bool = False, layer_past=None):
        base, config = self.model.model, self.model.config
        cache = layer_past if isinstance(layer_past, DynamicCache) else None
        if cache is None and use_cache:
            cache = DynamicCache(config=config)
        past = cache.get_seq_length(self.index) if cache is not None else 0
        positions = torch.arange(past, past + hidden.shape[1]).unsqueeze(0)  # [1, T]
        mask = create_causal_mask(config=config, inputs_embeds=hidden, attention_mask=None,
                                  cache=cache, position_ids=positions,
                                  layer_idx=self.index if cache is not None else None)  # fmt: skip
        rotary = base.rotary_emb(hidden, positions)
        out = base.layers[self.index](hidden, attention_mask=mask, position_embeddings=rotary,
                                      position_ids=positions, cache=cache,
                                      use_cache=cache is not None)  # fmt: skip
        out = out[0] if isinstance(out, tuple) else out
        return (out, cache) if use_cache else (out,)


def load_pretrained_block(model_dir: str | Path, block_index: int, *, config=None,
                          torch_dtype: torch.dtype = torch.float32) -> ReferenceBlock:  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).eval()
    return ReferenceBlock(model, block_index)
