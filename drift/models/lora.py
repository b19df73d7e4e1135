"""LoRA on a span's linear modules: which modules can take it, and adding it during a call.

`lora_targets` lists a block's linear modules (plain or bitsandbytes-quantized: both are
nn.Linear) with their sizes. `LoraHooks` puts one forward hook on each module the first time
weights for it arrive; during `use(...)` the hook adds x @ A^T @ B^T (B already scaled) to
the module's output, on top of the base output, so a quantized base stays as it is and
autograd reaches A and B. Outside `use` the hooks add nothing. Weights are named as on the
wire (drift.wire.lora). Touched only on the compute thread.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from drift.models.quant import Int8Linear
from drift.wire.lora import LoraTarget, parse_lora_name

Tensors = Mapping[str, torch.Tensor]
Pairs = dict[tuple[int, str], list[tuple[torch.Tensor, torch.Tensor]]]


def lora_targets(layer: nn.Module, index: int) -> tuple[LoraTarget, ...]:
    """Block `index`'s linear modules (on any device, meta included), by path in the block;
    a quantized one by the path of the linear it replaced (Int8Linear: not its `inner`)."""
    out, wrapped = [], set()
    for name, module in layer.named_modules():
        if isinstance(module, Int8Linear):
            wrapped.add(name + ".inner")
            module = module.inner
        elif not isinstance(module, nn.Linear) or not name or name in wrapped:
            continue
        out.append(LoraTarget(index, name, int(module.in_features), int(module.out_features)))
    return tuple(out)


def matches(target_modules: str | Sequence[str], full_name: str) -> bool:
    """peft's rule for `target_modules`: a string is a regex over the whole module name; a
    list matches a module named so, or whose name ends with "." + an entry."""
    if isinstance(target_modules, str):
        if target_modules == "all-linear":
            return True
        return re.fullmatch(target_modules, full_name) is not None
    return any(full_name == t or full_name.endswith("." + t) for t in target_modules)


def pairs_of(weights: Sequence[Tensors], device: torch.device, dtype: torch.dtype) -> Pairs:
    """(block, module) -> [(A, B), ...] from wire-named weights (several sets add up)."""
    out: Pairs = {}
    for named in weights:
        for name, a in named.items():
            parsed = parse_lora_name(name)
            if parsed is None or parsed[2] != "A":
                continue
            block, module, _ = parsed
            b = named[name[:-1] + "B"]
            out.setdefault((block, module), []).append((a.to(device, dtype), b.to(device, dtype)))
    return out


class LoraHooks:
    """LoRA added to the linear modules of a span's layers while weights are in use."""

    def __init__(self, layers: nn.ModuleList, start_block: int, device: torch.device,
                 dtype: torch.dtype) -> None:  # fmt: skip
        self.layers, self.start_block = layers, start_block
        self.device, self.dtype = device, dtype
        self._active: Pairs = {}
        self._fixed: list[Tensors] = []  # weights every call inside `fixed` uses too
        self._handles: dict[tuple[int, str], Any] = {}

    @contextlib.contextmanager
    def fixed(self, *weights: Tensors) -> Iterator[None]:
        """Weights (a served adapter, a session's) that every `use` inside adds as well."""
        before, self._fixed = self._fixed, [w for w in weights if w]
        try:
            yield
        finally:
            self._fixed = before

    @contextlib.contextmanager
    def use(self, weights: Tensors) -> Iterator[None]:
        """Add `weights` (and the fixed ones) to their modules for the calls inside."""
        pairs = pairs_of([*self._fixed, weights], self.device, self.dtype)
        for key in pairs:
            self._hook(key)
        before, self._active = self._active, pairs
        try:
            yield
        finally:
            self._active = before

    def _hook(self, key: tuple[int, str]) -> None:
        if key not in self._handles:
            module = self.layers[key[0] - self.start_block].get_submodule(key[1])
            self._handles[key] = module.register_forward_hook(functools.partial(self._add, key))

    def _add(self, key: tuple[int, str], module: nn.Module, args: tuple[Any, ...],
             output: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        pairs = self._active.get(key)
        if not pairs:
            return None
        x = args[0]  # [..., in]
        delta = sum((x.to(a.dtype) @ a.T) @ b.T for a, b in pairs)  # [..., out]
        return output + delta.to(output.dtype)  # type: ignore[union-attr]
