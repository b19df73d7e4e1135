"""Which files and tensors of a checkpoint a client needs: what the swarm serves as client parts.

The files are config, tokenizer, generation config and chat template, as a checkpoint
directory names them; the tensors are what drift.models.head.ClientHead reads (embeddings,
final norm, head, an embedding norm, Gemma 4's per-layer input embeddings) plus a
classification head when the checkpoint has one. Pure: names only, nothing is read here
but the checkpoint's tensor index.
"""

from __future__ import annotations

from typing import Any

import torch

from drift.models.registry import get_adapter

# Files of a checkpoint directory a client reads (those present are served).
CLIENT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
HEAD_NAME = "lm_head.weight"
CLASSIFIER_PREFIX = "score."  # AutoDistributedModelForSequenceClassification's head


def client_tensor_names(ckpt: Any) -> list[str]:
    """The names of every tensor a client of `ckpt` reads (sorted, as the checkpoint stores
    them: under a multimodal checkpoint's text tower; none of the blocks')."""
    adapter = get_adapter(ckpt.config)
    names = set(ckpt.tensor_names())
    stored = ckpt.layout.stored
    wanted = {stored(adapter.embed_name), stored(HEAD_NAME)} & names
    prefixes = [stored(adapter.norm_prefix), CLASSIFIER_PREFIX]
    with torch.device("meta"):  # modules built only for their parameter names
        if adapter.build_embed_norm() is not None and adapter.embed_norm_prefix:
            prefixes.append(stored(adapter.embed_norm_prefix))
        built = adapter.build_per_layer()
    wanted |= {n for n in names if n.startswith(tuple(prefixes))}
    if built is not None:
        module, prefix = built  # exact names: never the blocks under the same prefix
        wanted |= {stored(prefix + n) for n in module.state_dict()} & names
    return sorted(wanted)
