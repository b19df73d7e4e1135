"""docs/cluster.md's "What fits where" table: bytes per block and per model, and 16 GB machines needed.

The configs below are the architecture numbers of each model's config.json on the Hugging
Face Hub (copied here so the table is reproducible offline). Prices come from
drift.models.footprint, the functions `drift up` sizes spans with: each block built on the
meta device and priced as DRIFT loads it (int8/nf4: only the linear layers quantized; MoE
experts, norms and routers stay in the compute dtype, bfloat16 here). A 16 GB machine
holds what `drift up` would put on it: 90% of 16 GiB minus 1 GiB, each block with its
weights and a KV cache of 8192 tokens (the default --attn_cache_tokens). The client's
embeddings and head (bfloat16) are counted in the model's total, not on the servers.

    .venv/bin/python scripts/model_table.py      # prints the Markdown table docs/cluster.md holds
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.cli._capacity import CPU_RESERVE_BYTES, blocks_that_fit  # noqa: E402
from drift.models.footprint import block_weight_bytes, client_bytes, kv_bytes_per_token  # noqa: E402

MACHINE_BYTES = 16 << 30
CACHE_TOKENS = 8192
# (label, model_type, architecture numbers of its config.json)
MODELS: list[tuple[str, str, dict[str, Any]]] = [
    ("SmolLM2-135M", "llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
     num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)),
    ("Mistral-7B-v0.3", "mistral", dict(hidden_size=4096, intermediate_size=14336,
     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
     tie_word_embeddings=False)),
    ("Llama-3.1-8B", "llama", dict(hidden_size=4096, intermediate_size=14336,
     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
     tie_word_embeddings=False)),
    ("Gemma-2-27B", "gemma2", dict(hidden_size=4608, intermediate_size=36864,
     num_hidden_layers=46, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
     vocab_size=256000, tie_word_embeddings=True)),
    ("Mixtral-8x7B (MoE)", "mixtral", dict(hidden_size=4096, intermediate_size=14336,
     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
     num_experts_per_tok=2, vocab_size=32000, tie_word_embeddings=False)),
    ("Llama-3.1-70B", "llama", dict(hidden_size=8192, intermediate_size=28672,
     num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
     tie_word_embeddings=False)),
    ("Qwen2.5-72B", "qwen2", dict(hidden_size=8192, intermediate_size=29568,
     num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, vocab_size=152064,
     tie_word_embeddings=False)),
    ("Llama-3.1-405B", "llama", dict(hidden_size=16384, intermediate_size=53248,
     num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8, vocab_size=128256,
     tie_word_embeddings=False)),
]  # fmt: skip
FORMATS = [  # (name, compute dtype, quantization)
    ("float32", torch.float32, "none"),
    ("bfloat16", torch.bfloat16, "none"),
    ("int8", torch.bfloat16, "int8"),
    ("nf4", torch.bfloat16, "nf4"),
]


def row(label: str, model_type: str, numbers: dict[str, Any]) -> str:
    config = AutoConfig.for_model(model_type, **numbers)
    layers = int(config.num_hidden_layers)
    cells = [label, str(layers)]
    for _name, dtype, quant in FORMATS:
        blocks = block_weight_bytes(config, dtype, quant)
        block = max(blocks)
        cache = kv_bytes_per_token(config, dtype) * CACHE_TOKENS
        fit = blocks_that_fit(free_bytes=int(MACHINE_BYTES * 0.9), block_bytes=block,  # 10%: OS
                              cache_bytes=cache,
                              total_blocks=layers, reserve_bytes=CPU_RESERVE_BYTES)  # fmt: skip
        client = client_bytes(config, dtype if quant == "none" else torch.bfloat16)
        machines = str(math.ceil(layers / fit)) if fit else "-"
        cells.append(f"{_size(block)} / {_size(sum(blocks) + client)} / {machines}")
    return "| " + " | ".join(cells) + " |"


def _size(n: float) -> str:
    gib = n / (1 << 30)
    return f"{gib:.1f} GiB" if gib >= 1 else f"{n / (1 << 20):.0f} MiB"


def table() -> str:
    header = ["model", "blocks", *[f"{f[0]}: block / model / 16 GB machines" for f in FORMATS]]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += [row(*model) for model in MODELS]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
