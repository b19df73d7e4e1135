"""Where a model's weights and config come from: one `Checkpoint`, opened by `open_checkpoint`.

A Checkpoint is a local directory with config.json and safetensors weights, read lazily by
tensor-name prefix. `open_checkpoint` resolves aliases, GGUF files and Hub ids into such a
directory (drift.models.sources); it knows nothing of adapters, spans or the network.
`text_tensors` reads by the canonical (text-only) names adapters use, wherever the
checkpoint's own layout keeps them (drift.models.layout: a multimodal wrapper's text tower).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from drift.paths import default_cache_dir
from drift.wire.errors import BadRequest, NotFound

from .layout import TextLayout
from .sources.aliases import ALIASES, find_alias, resolve_alias
from .sources.gguf import cached_revision, convert_gguf, find_single_gguf
from .sources.hub import fetch_hub, fetch_hub_shards
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
        fetch_shards: Callable[[list[str]], None] | None = None,
    ) -> None:
        """`partial`: shards named by the index may be absent (a partial Hub fetch); then
        `fetch_shards(names)`, when given, brings absent shards into `path` on first use."""
        self.path = Path(path)
        self.name = name or self.path.name
        self.revision = revision
        self.config = load_config(self.path)
        self.fingerprint = config_fingerprint(self.config, revision)
        self._partial = partial
        self._fetch_shards = fetch_shards
        self._index = index_weights(self.path, partial=partial)
        self.layout = TextLayout.find(self.tensor_names())

    def tensor_names(self) -> list[str]:
        """Every tensor name of the model (also those in shards not fetched)."""
        return sorted([*self._index.files, *self._index.absent])

    def _absent(self, prefixes: tuple[str, ...]) -> list[str]:
        return sorted({s for n, s in self._index.absent.items() if n.startswith(prefixes)})

    def prefetch(self, prefixes: Iterable[str]) -> None:
        """Fetch, in one go, the absent shards holding tensors under any of `prefixes`.

        A partial Hub checkpoint fetches shards on first use anyway; this makes a span's
        shards one parallel download instead of one per block. No-op for local checkpoints.
        """
        absent = self._absent(tuple(prefixes))
        if absent and self._fetch_shards is not None:
            self._fetch_shards(absent)
            self._index = index_weights(self.path, partial=self._partial)

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors whose names start with `prefix`, prefix stripped; reads only those."""
        self.prefetch((prefix,))
        absent = self._absent((prefix,))
        if absent:
            raise NotFound(
                f"tensors {prefix}* of {self.name} are in shard(s) not downloaded: "
                f"{', '.join(absent)}; open the checkpoint with `blocks` covering them",
                missing=absent,
            )
        names = [n for n in self._index.files if n.startswith(prefix)]
        return {n[len(prefix) :]: t for n, t in read_tensors(self._index.files, names).items()}

    def text_tensors(self, canonical: str) -> dict[str, torch.Tensor]:
        """`tensors` of a canonical (text-only) prefix or name, as the layout stores it."""
        return self.tensors(self.layout.stored(canonical))

    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (transformers' AutoTokenizer); BadRequest naming the
        directory when it has no tokenizer files, or none transformers can read."""
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.path)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadRequest(
                f"cannot load the tokenizer of {self.name} from {self.path}: {first}"
            ) from exc

    def __repr__(self) -> str:
        return (
            f"Checkpoint(name={self.name!r}, path={str(self.path)!r}, fp={self.fingerprint[:12]})"
        )


def _open_gguf(
    gguf: Path, cache_dir: Path, dtype: torch.dtype | None, name: str | None = None
) -> Checkpoint:
    directory = convert_gguf(gguf.resolve(), cache_dir, dtype)
    return Checkpoint(directory, name=name or gguf.stem, revision=cached_revision(directory))


def _open_dir(
    directory: Path, cache_dir: Path, revision: str | None, dtype: torch.dtype | None
) -> Checkpoint:
    if not (directory / "config.json").is_file() and (gguf := find_single_gguf(directory)):
        return _open_gguf(gguf, cache_dir, dtype)
    # A GGUF conversion in the cache records its source: opened by path it is the same model
    # (same revision, so the same fingerprint) as when opened by its alias or .gguf file.
    return Checkpoint(directory.resolve(), revision=revision or cached_revision(directory))


def open_checkpoint(
    name_or_path: str | os.PathLike[str],
    *,
    cache_dir: Path | None = None,
    revision: str | None = None,
    blocks: range | None = None,
    dtype: torch.dtype | None = None,
    token: str | bool | None = None,
) -> Checkpoint:
    """Open an alias, a local dir, a .gguf file or a Hub id ("org/name") as a Checkpoint.

    GGUF files (also aliases) are converted once into `cache_dir` (default_cache_dir()), to
    `dtype`, the dtype the weights will run in (None: any conversion already cached, else
    bfloat16; enough for config and tokenizer). The fingerprint does not depend on it.
    Hub ids fetch config, tokenizer and index into the Hugging Face cache, plus the shards
    holding `blocks`; any other shard is fetched when a tensor in it is first read (`token`:
    huggingface_hub's, for gated or private repositories; None: HF_TOKEN or the login's).
    """
    text = os.fspath(name_or_path)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    alias = find_alias(text)
    if alias is not None:
        return _open_gguf(resolve_alias(alias, cache), cache, dtype, name=alias.name)
    path = Path(text).expanduser()
    if path.is_dir():
        return _open_dir(path, cache, revision, dtype)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _open_gguf(path, cache, dtype)
        raise BadRequest(f"{path} is neither a checkpoint directory nor a .gguf file")
    if text.startswith(("/", ".", "~")) or text.endswith(".gguf") or text.count("/") > 1:
        raise NotFound(f"checkpoint path {text} does not exist")
    if _HUB_ID.match(text):
        snapshot, commit = fetch_hub(text, revision=revision, blocks=blocks, token=token)
        return Checkpoint(
            snapshot,
            name=text,
            revision=commit,
            partial=True,
            fetch_shards=functools.partial(fetch_hub_shards, text, revision=commit, token=token),
        )
    raise NotFound(
        f"unknown model {text!r}: not a path that exists, not an alias "
        f"({', '.join(sorted(ALIASES))}) and not a Hub id (org/name)"
    )
