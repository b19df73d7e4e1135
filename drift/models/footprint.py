"""What serving a model's blocks costs in memory, from its config alone (nothing is loaded).

A block's weights are priced from its own layer built on `meta`, at the chosen dtype and
quantization (drift.models.quant.block_bytes: what a loaded block really holds); the KV cache
per cached token from the attention's shape, as the session cache stores it (tests compare
both with loaded spans and real caches). The client's pieces are priced the same way.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from packaging.version import Version

from drift.models.quant import block_bytes
from drift.models.registry import get_adapter

# Falcon's new decoder architecture (falcon-40b/180b, num_kv_heads) caches K/V expanded to every
# query head up to transformers 5.24, and only its grouped KV heads from 5.25 on.
FALCON_CACHES_GROUPED_KV = Version(transformers.__version__) >= Version("5.25.0.dev0")


def block_weight_bytes(config: Any, dtype: torch.dtype, quant: str = "none") -> list[int]:
    """Bytes of each block's weights once loaded in `dtype` with `quant`, block by block."""
    adapter = get_adapter(config)
    costs: dict[str, int] = {}  # layers of one kind (type, dense / MoE) cost the same
    out = []
    for i in range(adapter.num_layers):
        layer = adapter.build_layer(i)
        kind = f"{adapter.layer_type(i)}|{sorted(n for n, _ in layer.named_parameters())}"
        if kind not in costs:
            costs[kind] = block_bytes(layer, dtype, quant)
        out.append(costs[kind])
    return out


def kv_values_per_token(config: Any) -> int:
    """Numbers one block's KV cache stores per token: keys + values of its KV heads, or the
    compressed latent + rotary key of multi-head latent attention (DeepSeek)."""
    text = getattr(config, "text_config", None) or config
    if getattr(text, "kv_lora_rank", None):  # MLA caches one latent and one rotary key
        return int(text.kv_lora_rank) + int(text.qk_rope_head_dim)
    heads = int(text.num_attention_heads)
    if getattr(text, "model_type", "") == "falcon":  # no num_key_value_heads in its config
        # falcon-7b (multi_query) caches its one shared K/V head; the new decoder architecture
        # (falcon-40b, num_kv_heads) its grouped heads or all query heads (FALCON_CACHES_GROUPED_KV).
        if text.new_decoder_architecture:
            kv_heads = int(text.num_kv_heads) if FALCON_CACHES_GROUPED_KV else heads
        else:
            kv_heads = 1 if text.multi_query else heads
    else:
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return 2 * kv_heads * head_dim


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes one block's KV cache takes per cached token (activations are in `dtype`)."""
    return kv_values_per_token(config) * torch.empty((), dtype=dtype).element_size()


def client_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of what a client holds: embeddings, final norm and (untied) head, in `dtype`."""
    adapter = get_adapter(config)
    item = torch.empty((), dtype=dtype).element_size()
    embed = int(adapter.config.vocab_size) * adapter.hidden_size
    # a multimodal model ties as its own (outer) config says (as drift.models.head reads it)
    tied = bool(getattr(config, "tie_word_embeddings",
                        getattr(adapter.config, "tie_word_embeddings", False)))  # fmt: skip
    norms = [adapter.build_final_norm(), adapter.build_embed_norm()]
    extra = sum(p.numel() for norm in norms if norm is not None for p in norm.parameters())
    return (embed * (1 if tied else 2) + extra) * item
