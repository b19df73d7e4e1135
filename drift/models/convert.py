"""Checkpoint names to module names for one block, with transformers' own conversion rules.

transformers 5 fuses MoE experts in its modules (`experts.gate_up_proj`) while checkpoints keep
one tensor per expert; `get_checkpoint_conversion_mapping` says how to rename and merge. This
applies those rules to one block's tensors; it reads nothing and knows no family.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.core_model_loading import (
    Concatenate,
    MergeModulelist,
    WeightConverter,
    WeightRenaming,
)

from drift.wire.errors import BadRequest

_SUPPORTED_OPS = (MergeModulelist, Concatenate)


def convert_block(model_type: str, prefix: str, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """state: names relative to `prefix` as stored -> names relative to `prefix` as the module has."""
    transforms = get_checkpoint_conversion_mapping(model_type) or []
    full = {prefix + name: t for name, t in state.items()}
    for transform in transforms:
        if type(transform) is WeightRenaming:
            full = _rename(transform, full)
        elif isinstance(transform, WeightConverter):
            full = _merge(transform, full)
    out = {}
    for name, tensor in full.items():
        if not name.startswith(prefix):
            raise BadRequest(f"conversion moved {name!r} out of its block {prefix!r}")
        out[name[len(prefix) :]] = tensor
    return out


def _rename(transform: WeightRenaming, full: dict[str, Any]) -> dict[str, Any]:
    renamed = {}
    for name, tensor in full.items():
        for source, target in zip(
            transform.source_patterns, transform.target_patterns, strict=True
        ):
            name = re.sub(source, target, name)
        renamed[name] = tensor
    return renamed


def _merge(transform: WeightConverter, full: dict[str, Any]) -> dict[str, Any]:
    """Group tensors matching the converter's `*` patterns by their module, then merge them."""
    sources = list(transform.source_patterns)
    regexes = [re.compile(re.escape(s).replace(r"\*", r"(\d+)")) for s in sources]
    groups: dict[str, dict[str, list[tuple[int, str]]]] = {}
    for name in full:
        for source, regex in zip(sources, regexes, strict=True):
            match = regex.search(name)
            if match and match.end() == len(name):
                index = int(match.group(1)) if match.groups() else 0
                groups.setdefault(name[: match.start()], {}).setdefault(source, []).append(
                    (index, name)
                )
    if not groups:
        return full
    if not all(isinstance(op, _SUPPORTED_OPS) for op in transform.operations):
        raise BadRequest(f"checkpoint conversion {transform.operations} is not supported")
    full = dict(full)
    for module_prefix, by_source in groups.items():
        collected: dict[str, Any] = {}
        for source in sources:
            items = sorted(by_source.get(source, []))
            collected[source] = [full.pop(name) for _, name in items]
        for op in transform.operations:
            collected = op.convert(
                collected, source_patterns=sources, target_patterns=list(transform.target_patterns)
            )
        for target, tensor in collected.items():
            full[module_prefix + target] = tensor
    return full
