"""Activation compression on the wire: a frame's activations in a narrower form than the
model computes in, chosen per request by its `wire_dtype` param (the reply comes back in the
same form); the receiver restores the compute dtype before validation.

- `float16` / `bfloat16`: the tensor itself, cast (2 bytes per value).
- `int8`: blockwise absmax quantisation, the flattened tensor in blocks of `BLOCK` values,
  each block's largest magnitude as a float32 scale (`<name>.absmax`) and every value as
  round(127 * x / absmax) + 128 in a uint8 (1.25 bytes per value).

Only activations travel packed (hidden states, their gradients); masks, ids, prompts and
extras never do. The error each form adds is measured by scripts/bench_network.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from drift.wire.errors import BadRequest, BadTensor

WIRE_DTYPE = "wire_dtype"  # frame param naming the packed form
WIRE_FORMS = ("float16", "bfloat16", "int8")
ACTIVATIONS = ("hidden_states", "grad_outputs", "grad_inputs")  # what may travel packed
ABSMAX = ".absmax"  # suffix of an int8 tensor's block scales
BLOCK = 16  # values per int8 block (SmolLM2: 64 doubles the logit error, outliers)
_CASTS = {"float16": torch.float16, "bfloat16": torch.bfloat16}

Tensors = dict[str, torch.Tensor]


def check_form(wire_dtype: Any) -> str | None:
    """A valid wire form, or None for 'as computed'; BadRequest names the choices."""
    if wire_dtype is None or wire_dtype in WIRE_FORMS:
        return wire_dtype
    raise BadRequest(f"{WIRE_DTYPE} {wire_dtype!r} is not one of {list(WIRE_FORMS)}")


def pack(params: dict[str, Any], tensors: Tensors, wire_dtype: str | None) -> Tensors:
    """`tensors` with its activations in `wire_dtype` (params gain the `wire_dtype` field);
    unchanged for None."""
    form = check_form(wire_dtype)
    if form is None:
        return tensors
    params[WIRE_DTYPE] = form
    out = dict(tensors)
    for name in ACTIVATIONS:
        if name in out:
            if form == "int8":
                out[name], out[name + ABSMAX] = quantize(out[name])
            else:
                out[name] = out[name].to(_CASTS[form])
    return out


def unpack(params: dict[str, Any], tensors: Tensors, dtype: torch.dtype) -> Tensors:
    """`tensors` with its packed activations restored to `dtype` (as it was when the frame
    names no `wire_dtype`); BadTensor for packed tensors that do not fit their form."""
    form = check_form(params.get(WIRE_DTYPE))
    if form is None:
        return tensors
    out = dict(tensors)
    for name in ACTIVATIONS:
        if name not in out:
            continue
        t = out[name]
        if form == "int8":
            out[name] = dequantize(name, t, out.pop(name + ABSMAX, None), dtype)
        elif t.dtype != _CASTS[form]:
            raise BadTensor(f"{name} has dtype {t.dtype}, but the frame says {WIRE_DTYPE} "
                            f"{form!r}")  # fmt: skip
        else:
            out[name] = t.to(dtype)
    return out


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes of x's shape, float32 absmax per block of BLOCK flattened values)."""
    flat = x.detach().reshape(-1).float()
    pad = -flat.numel() % BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, BLOCK)
    absmax = blocks.abs().amax(dim=1)
    scale = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    codes = (blocks * scale[:, None]).round().clamp(-127, 127).add(128).to(torch.uint8)
    return codes.reshape(-1)[: flat.numel()].reshape(x.shape), absmax


def dequantize(name: str, codes: torch.Tensor, absmax: torch.Tensor | None,
               dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """The inverse of `quantize`, after checking the codes and scales agree."""
    if codes.dtype != torch.uint8:
        raise BadTensor(f"{name} travels as int8 codes in uint8, got {codes.dtype}")
    n_blocks = math.ceil(codes.numel() / BLOCK)
    if absmax is None or absmax.dtype != torch.float32 or tuple(absmax.shape) != (n_blocks,):
        got = "none" if absmax is None else f"{absmax.dtype} {list(absmax.shape)}"
        raise BadTensor(f"{name}{ABSMAX} must be float32 of shape [{n_blocks}] (one scale per "
                        f"{BLOCK} values), got {got}")  # fmt: skip
    if not torch.isfinite(absmax).all() or (absmax < 0).any():
        raise BadTensor(f"{name}{ABSMAX} holds negative or non-finite scales")
    flat = codes.reshape(-1).float().sub_(128)
    pad = -flat.numel() % BLOCK
    blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, BLOCK)
    values = blocks * (absmax / 127.0)[:, None]
    return values.reshape(-1)[: codes.numel()].reshape(codes.shape).to(dtype)
