"""scripts/make_model.py: a tiny shape written shard by shard loads in transformers with no
missing or extra keys, SmolLM2's tokenizer, the asked dtype, and the same weights per seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import make_model  # noqa: E402


@pytest.mark.slow  # SmolLM2's tokenizer, from the demo weights package
def test_tiny_shape_loads_in_transformers(tmp_path: Path) -> None:
    out = make_model.make_model("tiny-llama", tmp_path / "m", shard_bytes=2 << 20)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1  # sharded: 2 MiB shards for ~7 MiB of weights
    assert "lm_head.weight" not in index["weight_map"]  # tied embeddings
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.dtype == torch.bfloat16
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (64, 4, 2)
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == cfg.vocab_size == make_model.SMOLLM2_VOCAB
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert gen.shape == (1, ids.shape[1] + 3)
    # the same seed writes the same weights; another seed others
    again = make_model.make_model("tiny-llama", tmp_path / "again", tokenizer=False)
    other = make_model.make_model("tiny-llama", tmp_path / "other", seed=1, tokenizer=False)
    name = "model.layers.0.mlp.up_proj.weight"
    w = load_file(str(out / index["weight_map"][name]))[name]
    assert torch.equal(w, load_file(str(again / "model-00001-of-00001.safetensors"))[name])
    assert not torch.equal(w, load_file(str(other / "model-00001-of-00001.safetensors"))[name])
    assert 0.015 < w.float().std().item() < 0.025


def test_real_shapes_have_their_sizes() -> None:
    """The 3B shape is 5.5 GiB of bfloat16 with 28 layers of GQA 24/8; no weights written."""
    cfg = make_model.build_config("llama-3.2-3b", torch.bfloat16)
    shapes = make_model.param_shapes(cfg)
    total = sum(torch.Size(s).numel() for s in shapes.values()) * 2
    assert 5.4 < total / 2**30 < 5.6
    assert shapes["model.layers.27.self_attn.k_proj.weight"] == (8 * 128, 3072)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (8192, 3072)
    moe = make_model.param_shapes(make_model.build_config("mixtral-small", torch.bfloat16))
    assert moe["model.layers.0.mlp.experts.gate_up_proj"] == (8, 2 * 2816, 1024)  # 8 experts
    falcon = make_model.param_shapes(make_model.build_config("falcon-small", torch.bfloat16))
    # Falcon 7B's layout: 16 query heads and one key/value head of 64 in one fused product
    assert falcon["transformer.h.7.self_attention.query_key_value.weight"] == (1024 + 128, 1024)
    mla = make_model.param_shapes(make_model.build_config("deepseek-small", torch.bfloat16))
    # a 256-rank latent + 32 rope dims per token; 16 heads of 64 + 64 out of the latent
    assert mla["model.layers.7.self_attn.kv_a_proj_with_mqa.weight"] == (256 + 32, 1024)
    assert mla["model.layers.7.self_attn.kv_b_proj.weight"] == (16 * (64 + 64), 256)
    bloom = make_model.param_shapes(make_model.build_config("bloom-small", torch.bfloat16))
    assert bloom["transformer.h.7.self_attention.query_key_value.weight"] == (3 * 1024, 1024)


def test_gemma4_shape_shares_keys_values_across_a_halfway_cut() -> None:
    """gemma4-small: per-layer inputs, and its last 6 blocks read donors 3 and 5, so a cut at
    block 6 ships keys/values between servers; layer scalars are ones, as transformers sets
    them (N(0, 0.02) scalars shrank every block's output 50x, and the final norm then
    magnified float noise until a 1-row and a 4-row run of one prompt parted ways)."""
    from drift.models.sharing import KVSharing

    cfg = make_model.build_config("gemma4-small", torch.float32)
    shapes = make_model.param_shapes(cfg)
    assert shapes["model.embed_tokens_per_layer.weight"] == (make_model.SMOLLM2_VOCAB, 12 * 64)
    sharing = KVSharing.from_config(cfg)
    assert sharing.donated(0, 6, 12) == (3, 5) and sharing.consumed(6, 12) == (3, 5)
    scalar = make_model.random_tensor("model.layers.0.layer_scalar", (1,), torch.float32, 0, 0.02)
    assert torch.equal(scalar, torch.ones(1))
