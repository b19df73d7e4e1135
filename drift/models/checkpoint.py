"""Where a model's weights and config come from: one `Checkpoint`, opened by `open_checkpoint`.

A Checkpoint is a local directory with config.json and safetensors weights, read lazily by
tensor-name prefix. `open_checkpoint` resolves aliases, GGUF files and Hub ids into such a
directory (drift.models.sources); it knows nothing of adapters, spans or the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from drift.wire.errors import BadRequest, NotFound

from .sources.local import index_weights, read_tensors

# Config keys that do not change what the blocks compute: dtypes, token ids, bookkeeping.
_NOT_ARCHITECTURE = frozenset(
    {
        "dtype",
        "torch_dtype",
        "transformers_version",
        "architectures",
        "quantization_config",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "id2label",
        "label2id",
        "problem_type",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "use_cache",
        "chunk_size_feed_forward",
        "initializer_range",
        "torchscript",
        "tokenizer_class",
        "task_specific_params",
        "prefix",
        "finetuning_task",
    }
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def default_cache_dir() -> Path:
    """$DRIFT_CACHE, else ~/.cache/drift (read at call time)."""
    env = os.environ.get("DRIFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "drift"


def architecture_dict(config: PretrainedConfig) -> dict[str, Any]:
    """The config fields that define what the model computes (no dtype, ids or bookkeeping)."""
    return {
        key: value
        for key, value in sorted(config.to_dict().items())
        if not key.startswith("_") and key not in _NOT_ARCHITECTURE
    }


def config_fingerprint(config: PretrainedConfig, revision: str | None = None) -> str:
    """Hex sha256 of the canonical JSON of the architecture fields (+ revision when known)."""
    payload = {"config": architecture_dict(config), "revision": revision}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def load_config(directory: Path) -> PretrainedConfig:
    """The transformers config of `directory` (never trust_remote_code)."""
    if not (directory / "config.json").is_file():
        raise NotFound(f"{directory} has no config.json: not a transformers checkpoint directory")
    try:
        return AutoConfig.from_pretrained(directory, trust_remote_code=False)
    except Exception as exc:  # unknown model_type, invalid JSON, remote-code-only models
        raise BadRequest(f"cannot read the config of {directory}: {exc}") from exc


class Checkpoint:
    """One model's files, read lazily: config at open, tensors only when asked for."""

    def __init__(
        self,
        path: Path,
        *,
        name: str | None = None,
        revision: str | None = None,
        partial: bool = False,
    ) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self.revision = revision
        self.config = load_config(self.path)
        self.fingerprint = config_fingerprint(self.config, revision)
        self._files = index_weights(self.path, present_only=partial)

    def tensor_names(self) -> list[str]:
        return sorted(self._files)

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors whose names start with `prefix`, prefix stripped; reads only those."""
        names = [n for n in self._files if n.startswith(prefix)]
        return {n[len(prefix) :]: t for n, t in read_tensors(self._files, names).items()}

    def __repr__(self) -> str:
        return (
            f"Checkpoint(name={self.name!r}, path={str(self.path)!r}, fp={self.fingerprint[:12]})"
        )


def open_checkpoint(
    name_or_path: str | os.PathLike[str],
    *,
    cache_dir: Path | None = None,
    revision: str | None = None,
    blocks: range | None = None,
) -> Checkpoint:
    """Open an alias, a local dir, a .gguf file or a Hub id as a Checkpoint."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return Checkpoint(path.resolve())
    if path.exists():
        raise BadRequest(f"{path} is a file but not a .gguf file; give a checkpoint directory")
    looks_like_path = text.startswith(("/", ".", "~")) or text.endswith(".gguf")
    if looks_like_path or not _HUB_ID.match(text):
        raise NotFound(f"checkpoint path {text} does not exist")
    raise NotFound(f"cannot open {text}")
