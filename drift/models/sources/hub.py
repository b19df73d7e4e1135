"""Fetch a Hub checkpoint piece by piece into the normal Hugging Face cache.

Opening fetches only config, tokenizer files and the shard index (a repo with a single
`model.safetensors` has no smaller piece: that file comes whole); shards come later, only
those holding tensors someone reads: a server's blocks, a client's embeddings, norm and head.
Files live in the Hugging Face cache (HF_HUB_CACHE / HF_HOME, default ~/.cache/huggingface),
so what `transformers` or `hf download` already fetched is not fetched again, and the login of
`hf auth login` / HF_TOKEN applies. `select_shards` is the pure rule; a multimodal
checkpoint's vision and audio towers (Gemma 4) are never fetched. Safetensors only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from drift.wire.errors import BadRequest, DriftError, Forbidden, NotFound

from ..layout import TextLayout
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
SINGLE_FILE = "model.safetensors"
LOGIN_HINT = "log in with `hf auth login` (or set HF_TOKEN)"
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
    """Sorted shard file names holding the layers in `blocks` (None: every shard of the text
    model, never one holding only a multimodal checkpoint's vision or audio tower; the text
    tower is found by drift.models.layout, so an older save's `vision_tower.` layers are not
    taken for blocks).

    Tensors outside the layers (embeddings, final norm, head) are not a block's: a client
    reads them, and its reads fetch their shards.
    """
    layout = TextLayout.find(weight_map)
    text = {name: shard for name, shard in weight_map.items()
            if is_text(name) and layout.is_text(name)}  # fmt: skip
    if blocks is None:
        return sorted(set(text.values()))
    wanted = set(blocks)
    return sorted({shard for name, shard in text.items() if layer_of(name) in wanted})


def _explain(repo_id: str, revision: str | None, exc: Exception) -> DriftError:
    """A DRIFT error saying what to do about a failed Hub call."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"https://huggingface.co/{repo_id}"
    if isinstance(exc, GatedRepoError):
        return Forbidden(
            f"{repo_id!r} is a gated model: accept its licence on {page} with your account, "
            f"then {LOGIN_HINT} on this machine", repo_id=repo_id,
        )  # fmt: skip
    if isinstance(exc, RevisionNotFoundError):
        return NotFound(f"{repo_id!r} has no revision {revision!r}; check the branch, tag or "
                        "commit", repo_id=repo_id)  # fmt: skip
    if isinstance(exc, RepositoryNotFoundError):
        return NotFound(
            f"no Hub model {repo_id!r} (or it is private): check the id on {page}; for a "
            f"private model, {LOGIN_HINT}", repo_id=repo_id,
        )  # fmt: skip
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, HfHubHTTPError) and status in (401, 403):
        return Forbidden(f"the Hub refused access to {repo_id!r} ({status}): {LOGIN_HINT} with "
                         "a token that may read it", repo_id=repo_id)  # fmt: skip
    if isinstance(exc, LocalEntryNotFoundError | OSError):  # offline, unreachable, not cached
        return NotFound(
            f"cannot fetch {repo_id!r} (revision {revision or 'main'}) from the Hugging Face "
            f"Hub and it is not in the local Hugging Face cache: {type(exc).__name__}: {exc}. "
            "Check your network and HF_HUB_OFFLINE, or give a local checkpoint directory or "
            ".gguf file instead.", repo_id=repo_id,
        )  # fmt: skip
    return NotFound(f"cannot fetch {repo_id!r} from the Hugging Face Hub: "
                    f"{type(exc).__name__}: {exc}", repo_id=repo_id)  # fmt: skip


def _download(repo_id: str, revision: str | None, patterns: list[str],
              token: str | bool | None = None) -> Path:  # fmt: skip
    """Files of `repo_id` matching `patterns` into the Hugging Face cache; the snapshot dir.
    `token`: huggingface_hub's (None: HF_TOKEN or the `hf auth login` one)."""
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo_id, revision=revision, allow_patterns=patterns, token=token)
    except Exception as exc:  # not found, gated, offline, network: a message saying what to do
        raise _explain(repo_id, revision, exc) from exc
    return Path(str(path))


def fetch_hub_shards(repo_id: str, shards: list[str], *, revision: str,
                     token: str | bool | None = None) -> None:  # fmt: skip
    """Download shards of `repo_id` at commit `revision` (those not cached yet)."""
    if not shards:
        return
    log.info("Hub %s@%s: fetching shard(s) %s", repo_id, revision[:8], ", ".join(shards))
    _download(repo_id, revision, list(shards), token)


def fetch_hub(
    repo_id: str, *, revision: str | None = None, blocks: range | None = None,
    token: str | bool | None = None,
) -> tuple[Path, str]:  # fmt: skip
    """Config, tokenizer and index of `repo_id` (+ the shards of `blocks`); (snapshot, commit)."""
    snapshot = _download(repo_id, revision, [*META_FILES, SINGLE_FILE], token)
    commit = snapshot.name
    if not (snapshot / "config.json").is_file():
        raise NotFound(f"Hub repository {repo_id!r} has no config.json: not a transformers model")
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        if blocks is not None and len(blocks):
            fetch_hub_shards(repo_id, select_shards(read_index(index), blocks), revision=commit,
                             token=token)  # fmt: skip
    elif not (snapshot / SINGLE_FILE).is_file():
        raise BadRequest(
            f"Hub repository {repo_id!r} has no safetensors weights (model.safetensors or "
            "model.safetensors.index.json); DRIFT never loads pickle (pytorch_model.bin). "
            "Use a safetensors revision or convert the weights first."
        )
    return snapshot, commit
