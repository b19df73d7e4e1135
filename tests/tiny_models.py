"""Tiny random-weight models of every supported family, saved as safetensors directories.

Each config is small (hidden 64, 4-6 layers) but keeps what makes its family different:
sliding windows, per-layer types, MoE, latent attention, ALiBi, Gemma 4's per-layer inputs
and shared keys/values. `save_tiny(family, dir)` writes `config.json` + `model.safetensors`
and returns the directory. Gemma 4 (GEMMA4_FAMILIES) stays out of FAMILIES: its spans take
named tensors beside the hidden states, which the family-generic tests do not send.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", num_hidden_layers=4, **_COMMON),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=4, **_COMMON),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=4, head_dim=16, **_COMMON),
    "mistral": dict(model_type="mistral", num_hidden_layers=4, sliding_window=4, **_COMMON),
    "gemma2": dict(
        model_type="gemma2",
        num_hidden_layers=4,
        head_dim=16,
        sliding_window=4,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
        **_COMMON,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text",
        num_hidden_layers=6,
        head_dim=16,
        sliding_window=4,
        sliding_window_pattern=3,
        **_COMMON,
    ),
    "mixtral": dict(
        model_type="mixtral",
        num_hidden_layers=4,
        num_local_experts=4,
        num_experts_per_tok=2,
        **_COMMON,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        num_hidden_layers=4,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=2,
        mlp_only_layers=[0],
        **_COMMON,
    ),
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        num_hidden_layers=4,
        first_k_dense_replace=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        n_group=1,
        topk_group=1,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        # MLA has as many key/value heads as query heads (as the real model); fewer breaks
        # transformers' own cached multi-token steps.
        **{**_COMMON, "num_key_value_heads": 4},
    ),
    "falcon": dict(
        model_type="falcon",
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=256,
        new_decoder_architecture=False,
        multi_query=True,
        parallel_attn=True,
        alibi=False,
        bias=False,
    ),
    "falcon_alibi": dict(
        model_type="falcon",
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=256,
        new_decoder_architecture=False,
        multi_query=False,
        parallel_attn=False,
        alibi=True,
        bias=True,
    ),
    "bloom": dict(model_type="bloom", n_layer=4, hidden_size=64, n_head=4, vocab_size=256),
}

FAMILIES = sorted(TINY_CONFIGS)

# Gemma 4: 6 blocks s s f s s f; blocks 4 (s) and 5 (f) reuse the keys/values of their
# donors 3 (s) and 2 (f). Sliding window 8, per-layer inputs of 16, full layers' head dim 32.
_GEMMA4_TEXT: dict[str, Any] = dict(
    num_hidden_layers=6,
    head_dim=16,
    global_head_dim=32,
    sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=2,
    final_logit_softcapping=30.0,
    **{**_COMMON, "tie_word_embeddings": True},
)
_GEMMA4_PLE: dict[str, Any] = dict(hidden_size_per_layer_input=16, vocab_size_per_layer_input=256)
GEMMA4_CONFIGS: dict[str, dict[str, Any]] = {
    "gemma4_text": dict(model_type="gemma4_text", **_GEMMA4_TEXT, **_GEMMA4_PLE),
    "gemma4_moe": dict(
        model_type="gemma4_text",
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
        **{**_GEMMA4_TEXT, "tie_word_embeddings": False},
        **_GEMMA4_PLE,
    ),
    # Unified: no per-layer inputs, full layers with k = v and one key/value head
    "gemma4_unified_text": dict(
        model_type="gemma4_unified_text",
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        **_GEMMA4_TEXT,
    ),
    # the multimodal checkpoint: text tower + a one-layer vision and audio tower
    "gemma4": dict(
        model_type="gemma4",
        text_config=dict(**_GEMMA4_TEXT, **_GEMMA4_PLE),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
        ),
        audio_config=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            subsampling_conv_channels=[8, 4],
            output_proj_dims=32,
            conv_kernel_size=3,
        ),
        image_token_id=250,
        video_token_id=251,
        audio_token_id=252,
        boi_token_id=253,
        eoi_token_id=254,
        boa_token_id=255,
        eoa_token_index=249,
    ),  # fmt: skip
}
GEMMA4_FAMILIES = sorted(GEMMA4_CONFIGS)
_ALL_CONFIGS = {**TINY_CONFIGS, **GEMMA4_CONFIGS}


def tiny_config(family: str, **changes: Any):
    params = {**_ALL_CONFIGS[family], **changes}
    model_type = params.pop("model_type")
    return AutoConfig.for_model(model_type, **params)


def build_tiny(family: str, seed: int = 0, **changes: Any) -> torch.nn.Module:
    """A random-weight *ForCausalLM of `family` (its config with `changes`) in float32, eval
    mode."""
    torch.manual_seed(seed)
    config = tiny_config(family, **changes)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init leaves some norms at exactly 1 / biases at 0; perturb so every weight matters.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def save_tiny(family: str, directory: Path, seed: int = 0, **changes: Any) -> Path:
    model = build_tiny(family, seed, **changes)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


class TinyDirs:
    """`dirs(family)`: the tiny checkpoint of `family` saved under `root`, made once each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}

    def __call__(self, family: str) -> Path:
        if family not in self.made:
            self.made[family] = save_tiny(family, self.root / family)
        return self.made[family]
