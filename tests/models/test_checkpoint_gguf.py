"""The real SmolLM2 GGUF: converted once into the cache, then opened without reading it."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from drift.models.checkpoint import open_checkpoint
from drift.models.sources.aliases import ALIASES, resolve_alias

pytestmark = pytest.mark.slow

LAYER_KEYS = sorted(
    [
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
)


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("drift-cache")


def test_smollm2_alias_converts_once_and_matches_gguf(smollm2_cache: Path, caplog) -> None:
    """Without a dtype the conversion is bfloat16, equal tensor for tensor to transformers'
    own GGUF load in bfloat16; float32 on request, equal to its float32 load; one fingerprint."""
    caplog.set_level(logging.INFO, logger="drift.models.sources.gguf")
    started = time.monotonic()
    ckpt = open_checkpoint("smollm2", cache_dir=smollm2_cache)
    first = time.monotonic() - started
    assert any("converting once" in r.getMessage() for r in caplog.records)
    caplog.clear()
    started = time.monotonic()
    again = open_checkpoint("smollm2", cache_dir=smollm2_cache)
    second = time.monotonic() - started
    print(f"\nsmollm2 open: first {first:.1f} s (convert), second {second:.2f} s (cached)")
    assert not any("convert" in r.getMessage() for r in caplog.records)  # the cache was used
    assert again.path == ckpt.path and again.fingerprint == ckpt.fingerprint
    assert ckpt.name == "SmolLM2-135M-Instruct"
    assert ckpt.path.is_relative_to(smollm2_cache) and "-bfloat16-" in ckpt.path.name
    assert ckpt.revision is not None and ckpt.revision.startswith("gguf-sha256:")
    assert ckpt.config.model_type == "llama" and ckpt.config.num_hidden_layers == 30
    assert getattr(ckpt.config, "quantization_config", None) is None
    assert str(ckpt.config.dtype).removeprefix("torch.") == "bfloat16"
    assert not [p for p in ckpt.path.parent.iterdir() if p.name.startswith(".tmp")]
    layer3 = ckpt.tensors("model.layers.3.")
    assert sorted(layer3) == LAYER_KEYS
    assert all(t.dtype == torch.bfloat16 for t in layer3.values())
    size = (ckpt.path / "model.safetensors").stat().st_size
    assert 0.49 < size / (134.5e6 * 4) < 0.51  # half of float32's bytes

    f32 = open_checkpoint("smollm2", cache_dir=smollm2_cache, dtype=torch.float32)
    assert f32.path != ckpt.path and f32.fingerprint == ckpt.fingerprint  # one model, two dtypes
    assert f32.tensors("model.layers.3.")["mlp.up_proj.weight"].dtype == torch.float32
    # Without a dtype, an existing conversion serves (config and tokenizer are the same).
    assert open_checkpoint("smollm2", cache_dir=smollm2_cache).path == ckpt.path

    gguf = resolve_alias(ALIASES["smollm2"], smollm2_cache)
    ids = torch.randint(
        0, ckpt.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    for opened, dtype in ((ckpt, torch.bfloat16), (f32, torch.float32)):
        with torch.no_grad():
            cached = LlamaForCausalLM.from_pretrained(opened.path, dtype=dtype).eval()
            mine, cached_logits = cached.state_dict(), cached(ids).logits
            del cached
            direct = LlamaForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=dtype
            ).eval()
            theirs, direct_logits = direct.state_dict(), direct(ids).logits
            del direct
        assert sorted(mine) == sorted(theirs)
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), dtype  # bit for bit
        assert torch.equal(cached_logits, direct_logits), dtype

    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    tok_cached = AutoTokenizer.from_pretrained(ckpt.path)
    tok_direct = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert tok_cached(text)["input_ids"] == tok_direct(text)["input_ids"]


def test_second_open_reads_nothing_of_the_gguf(smollm2_cache: Path, tmp_path: Path) -> None:
    source = resolve_alias(ALIASES["smollm2"], smollm2_cache)
    gguf = tmp_path / source.name
    shutil.copy2(source, gguf)
    first = open_checkpoint(str(gguf), cache_dir=smollm2_cache)
    assert first.name == "SmolLM2-135M-Instruct.Q4_1"
    # Same name, size and mtime but garbage content: only the cache can answer now.
    stat = gguf.stat()
    gguf.write_bytes(b"\x00" * stat.st_size)
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = open_checkpoint(str(gguf), cache_dir=smollm2_cache)
    assert again.path == first.path and again.config.num_hidden_layers == 30
    assert sorted(again.tensors("model.layers.29.")) == LAYER_KEYS
    # A directory holding one GGUF and no config.json opens as that GGUF.
    in_dir = open_checkpoint(tmp_path, cache_dir=smollm2_cache)
    assert in_dir.path == first.path


def test_gemma3_alias_assembles_into_cache_and_matches_gguf(
    gemma3_cache: Path, tmp_path: Path, caplog
) -> None:
    """The shared `gemma3_cache` was fresh when its fixture opened the alias: that first open
    assembled the GGUF into it and converted once. Here: what it left, then a cached reopen."""
    from transformers import AutoModelForCausalLM

    from drift.models.sources.gguf import gguf_cache_path

    assembled = gemma3_cache / "gguf-src" / "gemma-3-270m-q4_k_m.gguf"
    assert assembled.is_file()  # assembled into the given cache, not ~/.cache
    converted = sorted((gemma3_cache / "gguf").iterdir())
    # one conversion (float32, asked for by the fixture), no .tmp
    assert converted == [gguf_cache_path(assembled, gemma3_cache, torch.float32)]
    assert not [p for p in assembled.parent.iterdir() if p.name.startswith(".tmp")]
    caplog.set_level(logging.INFO, logger="drift.models.sources.gguf")
    ckpt = open_checkpoint("gemma3-270m", cache_dir=gemma3_cache, dtype=torch.float32)
    assert ckpt.path == converted[0]
    assert not any("converting" in r.getMessage() for r in caplog.records)
    assert ckpt.revision is not None and ckpt.revision.startswith("gguf-sha256:")
    assert ckpt.name == "gemma-3-270m" and ckpt.config.model_type == "gemma3_text"
    assert ckpt.config.num_hidden_layers == 18
    assert "self_attn.q_norm.weight" in ckpt.tensors("model.layers.17.")
    # Assembly alone (no conversion: cheap) into another fresh dir also lands in that dir.
    fresh = resolve_alias(ALIASES["gemma3-270m"], tmp_path)
    assert fresh == tmp_path / "gguf-src" / assembled.name
    assert fresh.stat().st_size == assembled.stat().st_size
    assert not (tmp_path / "gguf").exists()
    ids = torch.randint(0, 1000, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cached = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
        cached_logits = cached(ids).logits
        del cached
        direct = AutoModelForCausalLM.from_pretrained(
            assembled.parent, gguf_file=assembled.name, dtype=torch.float32
        ).eval()
        assert torch.equal(cached_logits, direct(ids).logits)  # gemma's norm offsets included
    assert AutoTokenizer.from_pretrained(ckpt.path)("hello world")["input_ids"]


def test_converted_dir_opened_by_path_is_the_same_model_as_its_alias(gemma3_cache: Path) -> None:
    by_alias = open_checkpoint("gemma3-270m", cache_dir=gemma3_cache)
    by_path = open_checkpoint(str(by_alias.path), cache_dir=gemma3_cache)
    assert by_path.path == by_alias.path
    assert by_path.revision == by_alias.revision
    assert by_path.fingerprint == by_alias.fingerprint
