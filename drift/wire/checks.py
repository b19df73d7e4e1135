"""Checks of untrusted values: the one place that turns them into typed, trusted ones.

Field checks (params of a message), tensor checks, and the two request-level validations
every path shares: `check_pass` (hidden states with mask, deep prompts, beam reorder) and
`check_step_limits` (a step against its session's promises). The wire edge runs them on
what arrives; drift.models runs the same ones for direct callers; nothing runs them twice.
Each raises BadRequest / BadTensor / LengthExceeded / VersionMismatch naming the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from drift.wire.errors import BadRequest, BadTensor, LengthExceeded, VersionMismatch
from drift.wire.extras import NO_EXTRAS, ExtraSpec, Shape
from drift.wire.lora import LoraTarget, check_adapter_names, lora_name, parse_lora_name, split_lora
from drift.wire.version import PROTOCOL_VERSION, same_major

ACTIVATION_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
FLOAT_DTYPES = tuple(ACTIVATION_DTYPES.values())
INDEX_DTYPES = (torch.int64, torch.int32)
MASK_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def check_version(params: dict[str, Any]) -> None:
    """Refuse a message from another protocol major version (or one that names none)."""
    version = params.get("version")
    if not isinstance(version, str) or not version:
        raise BadRequest(f"missing 'version' (this peer speaks protocol {PROTOCOL_VERSION})")
    if not same_major(version):
        raise VersionMismatch(
            f"protocol version {version} is not compatible with {PROTOCOL_VERSION}: "
            "upgrade the older peer"
        )


def typed_object(obj: Any, kind: str, *, versioned: bool = True) -> dict[str, Any]:
    """`obj` as a JSON message of type `kind` (its `"type"`), of this protocol's major
    version where `versioned` (an error, from any peer, is read whatever its version)."""
    if not isinstance(obj, dict) or obj.get("type") != kind:
        got = obj.get("type") if isinstance(obj, dict) else type(obj).__name__
        raise BadRequest(f"expected a message of type {kind!r}, got {got!r}")
    if versioned:
        check_version(obj)
    return obj


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


def get_hex(params: dict[str, Any], name: str, length: int) -> str:
    """A string of exactly `length` lowercase hex digits (an id or secret a client chose)."""
    value = params.get(name)
    if (not isinstance(value, str) or len(value) != length
            or any(ch not in "0123456789abcdef" for ch in value)):  # fmt: skip
        raise BadRequest(f"field {name!r} must be {length} lowercase hex digits")
    return value


def get_flag(params: dict[str, Any], name: str) -> bool:
    """An optional boolean field (absent: False)."""
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"field {name!r} must be true or false, got {type(value).__name__}")
    return value


def get_span(params: dict[str, Any]) -> tuple[int, int]:
    start = get_int(params, "start_block")
    end = get_int(params, "end_block", low=1)
    if end <= start:
        raise BadRequest(f"empty span: end_block {end} must exceed start_block {start}")
    return start, end


def get_adapter(params: dict[str, Any]) -> str | None:
    """The optional `adapter` field: the name of a LoRA adapter the server holds."""
    if params.get("adapter") is None:
        return None
    value = params["adapter"]
    if not isinstance(value, str):
        raise BadRequest(f"field 'adapter' must be a string, got {type(value).__name__}")
    try:
        return check_adapter_names([value])[0]
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc


def no_extra_tensors(tensors: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Only `allowed` tensors (and LoRA weights, which check_pass checks against the span)."""
    extra = sorted(set(split_lora(tensors)[1]) - set(allowed))
    if extra:
        raise BadTensor(f"unexpected tensors {extra}; this message takes {list(allowed)}")


# --- one tensor -------------------------------------------------------------------------
def check_activation(name: str, tensor: Any, *, rank: int, hidden_size: int | None) -> torch.Tensor:
    """A floating tensor of the given rank whose last dim is the hidden size, all dims >= 1."""
    if not isinstance(tensor, torch.Tensor):
        raise BadTensor(f"{name} must be a tensor, got {type(tensor).__name__}")
    if tensor.dtype not in ACTIVATION_DTYPES.values():
        raise BadTensor(f"{name} has dtype {tensor.dtype}; activations travel as floating "
                        f"point: {list(ACTIVATION_DTYPES)}")  # fmt: skip
    if tensor.dim() != rank:
        raise BadTensor(
            f"{name} must have rank {rank}, got shape {list(tensor.shape)} (rank {tensor.dim()})"
        )
    if any(dim == 0 for dim in tensor.shape[:-1]):
        raise BadTensor(f"{name} has an empty dimension: shape {list(tensor.shape)}")
    if hidden_size is not None and tensor.shape[-1] != hidden_size:
        raise BadTensor(f"{name} has hidden size {tensor.shape[-1]}, this model's is {hidden_size}")
    return tensor


def check_mask(name: str, tensor: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """A 0/1 mask of exactly `shape` (integer, bool, or floating holding 0 and 1) as int64."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in (*MASK_DTYPES,
                                                                    *FLOAT_DTYPES):  # fmt: skip
        kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise BadTensor(f"{name} has dtype {kind}; masks are integer or bool")
    if tuple(tensor.shape) != shape:
        raise BadTensor(f"{name} has shape {list(tensor.shape)}, expected {list(shape)}")
    if bool(((tensor != 0) & (tensor != 1)).any()):
        raise BadTensor(f"{name} must hold only 0 and 1")
    return tensor.to(torch.int64)


def check_indices(name: str, tensor: Any, size: int) -> torch.Tensor:
    """A [size] integer tensor with values in [0, size), as int64."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in INDEX_DTYPES:
        kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise BadTensor(f"{name} has dtype {kind}; it must be int64 or int32")
    if tuple(tensor.shape) != (size,):
        raise BadTensor(f"{name} has shape {list(tensor.shape)}, expected [{size}]")
    if bool(((tensor < 0) | (tensor >= size)).any()):
        raise BadTensor(f"{name} values must lie in [0, {size})")
    return tensor.to(torch.int64)


def check_grad_outputs(grad: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The gradient w.r.t. a pass's output: an activation of the hidden states' shape."""
    grad = check_activation("grad_outputs", grad, rank=3, hidden_size=hidden.shape[-1])
    if grad.shape != hidden.shape:
        raise BadTensor(
            f"grad_outputs has shape {list(grad.shape)} but hidden_states has {list(hidden.shape)}"
        )
    return grad


def check_prompts(
    prompts: Any, n_blocks: int | None, batch: int, hidden_size: int | None
) -> torch.Tensor | None:
    """Deep prompts are [n_blocks, B or 1, P, H]; n_blocks is checked when the span is known."""
    if prompts is None:
        return None
    prompts = check_activation("prompts", prompts, rank=4, hidden_size=hidden_size)
    if n_blocks is not None and prompts.shape[0] != n_blocks:
        raise BadTensor(f"prompts cover {prompts.shape[0]} blocks, the span has {n_blocks}")
    if prompts.shape[1] not in (1, batch):
        raise BadTensor(f"prompts have batch {prompts.shape[1]}, hidden_states have {batch}")
    return prompts


def check_named(
    tensors: Mapping[str, Any], specs: tuple[tuple[str, Shape], ...], *, batch: int, tokens: int
) -> dict[str, torch.Tensor]:
    """Exactly the tensors `specs` names, each floating point and of its templated shape
    ("B" = batch, "T" = tokens, "*" = any size >= 1): the extras of drift.wire.extras."""
    missing = [name for name, _ in specs if name not in tensors]
    if missing:
        raise BadTensor(f"missing tensors {missing}: this span takes {[n for n, _ in specs]}")
    extra = sorted(set(tensors) - {name for name, _ in specs})
    if extra:
        raise BadTensor(f"unexpected tensors {extra}; this span takes {[n for n, _ in specs]}")
    sizes = {"B": batch, "T": tokens}
    out = {}
    for name, template in specs:
        t = check_activation(name, tensors[name], rank=len(template), hidden_size=None)
        want = [sizes.get(d, d) if isinstance(d, str) else d for d in template]
        if t.shape[-1] == 0 or any(
            w != "*" and w != got for w, got in zip(want, t.shape, strict=True)
        ):
            shown = ["any" if w == "*" else w for w in want]
            raise BadTensor(f"{name} has shape {list(t.shape)}, expected {shown}")
        out[name] = t
    return out


def check_lora(tensors: Mapping[str, Any], targets: tuple[LoraTarget, ...]) -> dict[str, Any]:
    """LoRA weights (drift.wire.lora) for modules among `targets`: both parts of each, A
    [r, in] and B [out, r] with one rank 1 <= r <= min(in, out), floating point, finite."""
    known = {(t.block, t.module): t for t in targets}
    out = {}
    for name in sorted(tensors):
        parsed = parse_lora_name(name)
        if parsed is None:
            raise BadTensor(f"{name!r} is not a LoRA weight name (lora.<block>.<module>.A|B)")
        block, module, part = parsed
        target = known.get((block, module))
        if target is None:
            where = sorted({m for b, m in known if b == block})
            raise BadTensor(f"{name}: block {block} has no LoRA-adaptable module {module!r} "
                            f"here (it has {where})")  # fmt: skip
        other = lora_name(block, module, "B" if part == "A" else "A")
        if other not in tensors:
            raise BadTensor(f"{name} comes without {other}")
        if part == "B":
            continue
        a = check_activation(name, tensors[name], rank=2, hidden_size=target.in_features)
        b = check_activation(other, tensors[other], rank=2, hidden_size=None)
        r = a.shape[0]
        if r > min(target.in_features, target.out_features):
            raise BadTensor(f"{name} has rank {r}, past this module's "
                            f"{min(target.in_features, target.out_features)}")  # fmt: skip
        if tuple(b.shape) != (target.out_features, r):
            raise BadTensor(f"{other} has shape {list(b.shape)}, expected "
                            f"[{target.out_features}, {r}]")  # fmt: skip
        if not (bool(a.isfinite().all()) and bool(b.isfinite().all())):
            raise BadTensor(f"the LoRA weights of block {block} {module} are not all finite")
        out[name], out[other] = a, b
    return out


def get_donate(params: dict[str, Any], spec: ExtraSpec) -> tuple[int, ...]:
    """The optional `donate` list: blocks of the span whose shared K/V the reply must carry."""
    if "donate" not in params:
        return ()
    value = params["donate"]
    if not isinstance(value, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in value
    ):
        raise BadRequest("field 'donate' must be a list of block indices")
    donors = [block for block, _ in spec.donors]
    wrong = sorted(set(value) - set(donors))
    if wrong or len(set(value)) != len(value):
        raise BadRequest(
            f"cannot donate the keys/values of blocks {wrong or value}: this span shares "
            f"those of {donors} with later blocks (each at most once)"
        )
    return tuple(sorted(value))


# --- whole requests: the one validation of each kind of input --------------------------
@dataclass(frozen=True)
class PassInputs:
    """A validated stateless pass (forward / backward, or one step of a session)."""

    hidden: torch.Tensor  # [B, T, H]
    attention_mask: torch.Tensor | None  # [B, T] int64 0/1
    prompts: torch.Tensor | None  # [n_blocks, B or 1, P, H]
    hypo_ids: torch.Tensor | None = None  # [B] int64 (steps only)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # by name (drift.wire.extras)


def check_pass(
    hidden: Any, attention_mask: Any, prompts: Any, *, hidden_size: int | None,
    n_blocks: int | None, hypo_ids: Any = None, extras: Mapping[str, Any] | None = None,
    spec: ExtraSpec = NO_EXTRAS,
) -> PassInputs:  # fmt: skip
    """Hidden states [B, T, H] with their optional mask, deep prompts and beam reorder, and
    the named tensors beside them that `spec` says the span takes (Gemma 4; LoRA weights)."""
    hidden = check_activation("hidden_states", hidden, rank=3, hidden_size=hidden_size)
    batch, tokens = hidden.shape[:2]
    lora, named = split_lora(extras or {})
    return PassInputs(
        hidden,
        None
        if attention_mask is None
        else check_mask("attention_mask", attention_mask, (batch, tokens)),  # fmt: skip
        check_prompts(prompts, n_blocks, batch, hidden_size),
        None if hypo_ids is None else check_indices("hypo_ids", hypo_ids, batch),
        {**check_named(named, spec.inputs, batch=batch, tokens=tokens),
         **check_lora(lora, spec.lora)},
    )  # fmt: skip


@dataclass(frozen=True)
class StepLimits:
    """What an inference session promised when it opened; each step is checked against it."""

    hidden_size: int
    batch_size: int
    max_length: int  # tokens, prompt included
    n_blocks: int  # blocks of the session's (sub-)span
    dtype: torch.dtype | None = None  # the session's activation dtype; None: any
    extras: ExtraSpec = NO_EXTRAS  # the named tensors each step carries (Gemma 4)


def check_step_limits(inputs: PassInputs, position: int, limits: StepLimits) -> None:
    """A structurally valid step against its session's promises (stateless: not the cache)."""
    batch, tokens = inputs.hidden.shape[:2]
    if batch != limits.batch_size:
        raise BadTensor(f"session batch size is {limits.batch_size}, got {batch}")
    if limits.dtype is not None and inputs.hidden.dtype != limits.dtype:
        raise BadTensor(f"step hidden_states are {inputs.hidden.dtype}, the session uses "
                        f"{dtype_name(limits.dtype)}")  # fmt: skip
    if position + tokens > limits.max_length:
        raise LengthExceeded(
            f"step at position {position} with {tokens} tokens would reach {position + tokens}, "
            f"past the session's max_length {limits.max_length}"
        )


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32: the names messages carry."""
    return str(dtype).removeprefix("torch.")


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


def tensor(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A required named tensor of a frame."""
    if name not in tensors:
        raise BadTensor(f"missing tensor {name!r}")
    return tensors[name]
