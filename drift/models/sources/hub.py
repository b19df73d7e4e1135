"""Fetch a Hub checkpoint partially: config, tokenizer, index, and only the needed shards.

A server serving blocks [a, b) needs the shards holding those layers plus the client
pieces (embeddings, final norm, head, Gemma 4's per-layer embeddings), never the rest, and
never a multimodal checkpoint's vision or audio tower. `select_shards` is the pure rule;
`fetch_hub` applies it with huggingface_hub into DRIFT's cache. Safetensors only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from drift.wire.errors import BadRequest, NotFound

from .local import read_index

log = logging.getLogger(__name__)

META_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "model.safetensors.index.json",
)
_LAYER = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")
# What DRIFT never reads: the vision and audio towers of a multimodal checkpoint (Gemma 4,
# Gemma 4 Unified: model.vision_tower., model.audio_tower., model.embed_vision., ...).
_NOT_TEXT = re.compile(r"^model\.(?:vision_tower|audio_tower|embed_vision|embed_audio)\.")


def is_text(tensor_name: str) -> bool:
    """False for a multimodal checkpoint's vision and audio tensors."""
    return _NOT_TEXT.match(tensor_name) is None


def layer_of(tensor_name: str) -> int | None:
    """The decoder layer a tensor belongs to (`model.layers.7.`, `transformer.h.7.`,
    `model.language_model.layers.7.`), or None (also for vision and audio layers)."""
    match = _LAYER.search(tensor_name) if is_text(tensor_name) else None
    return int(match.group(1)) if match else None


def select_shards(weight_map: Mapping[str, str], blocks: Iterable[int] | None) -> list[str]:
    """Shards holding the layers in `blocks` plus every text tensor outside a layer (client
    pieces); never those holding only vision or audio tensors.

    `blocks` None means the whole model. Sorted shard file names.
    """
    wanted = None if blocks is None else set(blocks)
    shards = {
        shard
        for name, shard in weight_map.items()
        if is_text(name)
        and (wanted is None or (layer := layer_of(name)) is None or layer in wanted)
    }
    return sorted(shards)


def _download(
    repo_id: str, revision: str | None, cache_dir: Path, patterns: list[str],
    token: str | bool | None = None,
) -> Path:  # fmt: skip
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns, token=token
        )
    except Exception as exc:  # not found, gated, offline, network: all mean "cannot fetch"
        raise NotFound(
            f"cannot fetch {repo_id!r} (revision {revision or 'main'}) from the Hugging Face Hub: "
            f"{type(exc).__name__}: {exc}. Check the model id, your network and HF_HUB_OFFLINE, "
            "or give a local checkpoint directory or .gguf file instead.",
            repo_id=repo_id,
        ) from exc
    return Path(str(path))


def fetch_hub_shards(
    repo_id: str, shards: list[str], *, cache_dir: Path, revision: str,
    token: str | bool | None = None,
) -> None:  # fmt: skip
    """Download more shards of `repo_id` at commit `revision` into its snapshot dir."""
    log.info("Hub %s@%s: fetching shard(s) %s", repo_id, revision[:8], ", ".join(shards))
    _download(repo_id, revision, cache_dir / "hub", list(shards), token)


def fetch_hub(
    repo_id: str, *, cache_dir: Path, revision: str | None = None, blocks: range | None = None,
    token: str | bool | None = None,
) -> tuple[Path, str]:  # fmt: skip
    """Download what `blocks` needs of `repo_id`; returns (snapshot dir, commit hash).
    `token`: huggingface_hub's (None: its own default, HF_TOKEN or the saved login)."""
    hub_cache = cache_dir / "hub"
    snapshot = _download(repo_id, revision, hub_cache, [*META_FILES, "model.safetensors"], token)
    commit = snapshot.name
    if not (snapshot / "config.json").is_file():
        raise NotFound(f"Hub repository {repo_id!r} has no config.json: not a transformers model")
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_index(index)
        shards = select_shards(weight_map, blocks)
        log.info(
            "Hub %s@%s: fetching %d shard(s) for blocks %s",
            repo_id,
            commit[:8],
            len(shards),
            blocks,
        )
        _download(repo_id, commit, hub_cache, shards, token)
    elif not (snapshot / "model.safetensors").is_file():
        raise BadRequest(
            f"Hub repository {repo_id!r} has no safetensors weights (model.safetensors or "
            "model.safetensors.index.json); DRIFT never loads pickle (pytorch_model.bin). "
            "Use a safetensors revision or convert the weights first."
        )
    return snapshot, commit
