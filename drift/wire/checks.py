"""Field checks for wire messages: one place that turns untrusted values into typed ones.

Each check raises BadRequest / BadTensor / VersionMismatch naming the field and the problem.
Knows nothing about which message uses which field (messages.py).
"""

from __future__ import annotations

from typing import Any

import torch

from drift import PROTOCOL_VERSION
from drift.wire.errors import BadRequest, BadTensor, VersionMismatch

ACTIVATION_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
INDEX_DTYPES = (torch.int64, torch.int32)
MASK_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def check_version(params: dict[str, Any]) -> None:
    """Refuse a message from another protocol major version (or one that names none)."""
    version = params.get("version")
    if not isinstance(version, str) or not version:
        raise BadRequest(f"missing 'version' (this peer speaks protocol {PROTOCOL_VERSION})")
    if version.split(".")[0] != PROTOCOL_VERSION.split(".")[0]:
        raise VersionMismatch(
            f"protocol version {version} is not compatible with {PROTOCOL_VERSION}: "
            "upgrade the older peer"
        )


def get_int(params: dict[str, Any], name: str, *, low: int = 0, high: int | None = None) -> int:
    if name not in params:
        raise BadRequest(f"missing field {name!r}")
    value = params[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise BadRequest(f"field {name!r} = {value} is out of range {bound}")
    return value


def get_str(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"field {name!r} must be a non-empty string")
    return value


def get_span(params: dict[str, Any]) -> tuple[int, int]:
    start = get_int(params, "start_block")
    end = get_int(params, "end_block", low=1)
    if end <= start:
        raise BadRequest(f"empty span: end_block {end} must exceed start_block {start}")
    return start, end


def no_extra_tensors(tensors: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(tensors) - set(allowed))
    if extra:
        raise BadTensor(f"unexpected tensors {extra}; this message takes {list(allowed)}")


def activation(
    tensors: dict[str, torch.Tensor], name: str, *, rank: int, hidden_size: int | None
) -> torch.Tensor:
    """A floating tensor of the given rank whose last dim is the hidden size, all dims >= 1."""
    tensor = _present(tensors, name)
    if tensor.dtype not in ACTIVATION_DTYPES.values():
        raise BadTensor(
            f"{name} has dtype {tensor.dtype}; activations travel as {list(ACTIVATION_DTYPES)}"
        )
    _rank(name, tensor, rank)
    if any(dim == 0 for dim in tensor.shape[:-1]):
        raise BadTensor(f"{name} has an empty dimension: shape {list(tensor.shape)}")
    if hidden_size is not None and tensor.shape[-1] != hidden_size:
        raise BadTensor(f"{name} has hidden size {tensor.shape[-1]}, this model's is {hidden_size}")
    return tensor


def optional_activation(
    tensors: dict[str, torch.Tensor], name: str, *, rank: int, hidden_size: int | None
) -> torch.Tensor | None:
    if name not in tensors:
        return None
    return activation(tensors, name, rank=rank, hidden_size=hidden_size)


def mask(
    tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]
) -> torch.Tensor | None:
    """An optional 0/1 mask of exactly `shape`, returned as int64."""
    if name not in tensors:
        return None
    tensor = tensors[name]
    if tensor.dtype not in MASK_DTYPES:
        raise BadTensor(f"{name} has dtype {tensor.dtype}; masks are integer or bool")
    if tuple(tensor.shape) != shape:
        raise BadTensor(f"{name} has shape {list(tensor.shape)}, expected {list(shape)}")
    tensor = tensor.to(torch.int64)
    if bool(((tensor != 0) & (tensor != 1)).any()):
        raise BadTensor(f"{name} must hold only 0 and 1")
    return tensor


def indices(tensors: dict[str, torch.Tensor], name: str, size: int) -> torch.Tensor | None:
    """An optional [size] integer tensor with values in [0, size), returned as int64."""
    if name not in tensors:
        return None
    tensor = tensors[name]
    if tensor.dtype not in INDEX_DTYPES:
        raise BadTensor(f"{name} has dtype {tensor.dtype}; it must be int64 or int32")
    if tuple(tensor.shape) != (size,):
        raise BadTensor(f"{name} has shape {list(tensor.shape)}, expected [{size}]")
    tensor = tensor.to(torch.int64)
    if bool(((tensor < 0) | (tensor >= size)).any()):
        raise BadTensor(f"{name} values must lie in [0, {size})")
    return tensor


def same_shape(name: str, tensor: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    if tensor.shape != like.shape:
        raise BadTensor(
            f"{name} has shape {list(tensor.shape)} but {like_name} has {list(like.shape)}"
        )


def check_prompts(prompts: torch.Tensor | None, n_blocks: int | None, batch: int) -> None:
    """Deep prompts are [n_blocks, B, P, H]; n_blocks is checked when the span is known."""
    if prompts is None:
        return
    if n_blocks is not None and prompts.shape[0] != n_blocks:
        raise BadTensor(f"prompts cover {prompts.shape[0]} blocks, the span has {n_blocks}")
    if prompts.shape[1] not in (1, batch):
        raise BadTensor(f"prompts have batch {prompts.shape[1]}, hidden_states have {batch}")


def from_nested(obj: dict[str, Any], name: str, *, required: bool) -> torch.Tensor | None:
    """A nested JSON list -> float32 tensor (the plain-JSON forms of /forward and /backward)."""
    if name not in obj or obj[name] is None:
        if required:
            raise BadRequest(f"missing field {name!r}")
        return None
    dtype = torch.int64 if name == "attention_mask" else torch.float32
    try:
        return torch.tensor(obj[name], dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise BadTensor(f"{name} is not a rectangular array of numbers: {exc}") from exc


def _present(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise BadTensor(f"missing tensor {name!r}")
    return tensors[name]


def _rank(name: str, tensor: torch.Tensor, rank: int) -> None:
    if tensor.dim() != rank:
        raise BadTensor(
            f"{name} must have rank {rank}, got shape {list(tensor.shape)} (rank {tensor.dim()})"
        )
