"""Index the safetensors weights of a local checkpoint directory, and read them by prefix.

Knows only files: `model.safetensors`, or shards named by `model.safetensors.index.json`.
Reads headers to list tensors and `safe_open` to read the few a caller asks for; never
loads a whole file, never touches pickle (`pytorch_model.bin` is refused).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from drift.wire.errors import BadRequest, NotFound

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def read_index(index_path: Path) -> dict[str, str]:
    """The `weight_map` (tensor name -> shard file name) of a safetensors index file."""
    try:
        data = json.loads(index_path.read_text())
    except (OSError, ValueError) as exc:
        raise BadRequest(f"cannot read safetensors index {index_path}: {exc}") from exc
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise BadRequest(f"safetensors index {index_path} has no valid 'weight_map'")
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:
            raise BadRequest(
                f"safetensors index {index_path} names a shard outside the dir: {shard}"
            )
    return dict(weight_map)


def _file_keys(path: Path) -> list[str]:
    """Tensor names in one safetensors file, from its header only (validates the header)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises SafetensorsError / OSError / ValueError
        raise BadRequest(
            f"corrupt safetensors file {path}: {exc}. Delete it and download or convert again."
        ) from exc


@dataclass(frozen=True)
class WeightIndex:
    """Where each tensor lives: `files` for tensors on disk, `absent` for shards not fetched."""

    files: dict[str, Path]  # tensor name -> safetensors file holding it
    absent: dict[str, str]  # tensor name -> shard file name not downloaded (partial Hub fetch)


def index_weights(directory: Path, *, partial: bool = False) -> WeightIndex:
    """Index every tensor of the checkpoint in `directory` (reads safetensors headers only).

    With `partial`, shards named by the index but absent are recorded in `absent` (a partial
    Hub download); otherwise a missing shard is NotFound naming it.
    """
    index_path = directory / INDEX_FILE
    single = directory / SINGLE_FILE
    if index_path.is_file():
        weight_map = read_index(index_path)
        shards = sorted(set(weight_map.values()))
        missing = {s for s in shards if not (directory / s).is_file()}
        if missing and not partial:
            raise NotFound(
                f"checkpoint {directory} is missing shard file(s) named in {INDEX_FILE}: "
                + ", ".join(sorted(missing)),
                missing=sorted(missing),
            )
        for shard in shards:
            if shard not in missing:
                _file_keys(directory / shard)  # validate the header now, not mid-load
        return WeightIndex(
            files={n: directory / s for n, s in weight_map.items() if s not in missing},
            absent={n: s for n, s in weight_map.items() if s in missing},
        )
    if single.is_file():
        return WeightIndex(files={name: single for name in _file_keys(single)}, absent={})
    if any((directory / p).exists() for p in PICKLE_FILES):
        raise BadRequest(
            f"checkpoint {directory} has only pickle weights (pytorch_model.bin); DRIFT loads "
            "safetensors only. Convert it to safetensors first (save_pretrained(..., "
            "safe_serialization=True) in a trusted environment)."
        )
    raise NotFound(
        f"checkpoint {directory} has no safetensors weights ({SINGLE_FILE} or {INDEX_FILE})"
    )


def read_tensors(files: dict[str, Path], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Read exactly `names` (full tensor names), opening each file once with safe_open."""
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for path, wanted in by_file.items():
        if not path.is_file():
            raise NotFound(f"weight file {path} disappeared; open the checkpoint again")
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in wanted:
                    out[name] = f.get_tensor(name)
        except Exception as exc:
            raise BadRequest(f"cannot read tensors from {path}: {exc}") from exc
    return out
