"""LoRA weights in frames: how they are named, and which a span can take.

A request may carry low-rank weights for linear modules of its blocks beside the hidden
states: `lora.<block>.<module>.A` [r, in] and `lora.<block>.<module>.B` [out, r], where
<module> is the module's path inside the block (e.g. `self_attn.q_proj`) and the module's
output gains x @ A^T @ B^T (any scaling is already in B). A backward returns their gradients
as `grad.lora.<...>`. `LoraTarget` says which modules of a span can take them, and their
sizes; checks.check_lora enforces it. Knows nothing about models or peft.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

PREFIX = "lora."
PARTS = ("A", "B")
MAX_ADAPTER_NAME = 64  # characters of a served adapter's name
V = TypeVar("V")


@dataclass(frozen=True)
class LoraTarget:
    """A linear module of one block that LoRA weights may adapt."""

    block: int  # absolute block index
    module: str  # path inside the block, e.g. "self_attn.q_proj"
    in_features: int
    out_features: int


def lora_name(block: int, module: str, part: str) -> str:
    """The frame name of part "A" or "B" of the weights of `module` in block `block`."""
    return f"{PREFIX}{block}.{module}.{part}"


def is_lora(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_lora_name(name: str) -> tuple[int, str, str] | None:
    """("lora.3.self_attn.q_proj.A") -> (3, "self_attn.q_proj", "A"); None if malformed."""
    if not is_lora(name):
        return None
    block, _, rest = name[len(PREFIX) :].partition(".")
    module, _, part = rest.rpartition(".")
    if not block.isdigit() or not module or part not in PARTS:
        return None
    return int(block), module, part


def in_span(tensors: Mapping[str, V], start: int, end: int) -> dict[str, V]:
    """The LoRA entries of `tensors` that belong to blocks [start, end)."""
    out = {}
    for name, value in tensors.items():
        parsed = parse_lora_name(name)
        if parsed is not None and start <= parsed[0] < end:
            out[name] = value
    return out


def split_lora(tensors: Mapping[str, V]) -> tuple[dict[str, V], dict[str, V]]:
    """(the LoRA entries, the others)."""
    lora = {k: v for k, v in tensors.items() if is_lora(k)}
    return lora, {k: v for k, v in tensors.items() if not is_lora(k)}


def check_adapter_names(names: Iterable[str]) -> tuple[str, ...]:
    """Served adapters' names: non-empty, short, no ':' (the API's `model:adapter`)."""
    out = tuple(names)
    for name in out:
        if not name or len(name) > MAX_ADAPTER_NAME or ":" in name or name.strip() != name:
            raise ValueError(
                f"adapter name {name!r} must be 1-{MAX_ADAPTER_NAME} characters without ':' "
                "or surrounding spaces"
            )
    if len(set(out)) != len(out):
        raise ValueError(f"adapter names must be distinct, got {list(out)}")
    return out


def adapter_param(name: str | None) -> dict[str, str]:
    """A message's `adapter` field, present only when one is asked for (other messages stay
    byte-identical)."""
    return {} if name is None else {"adapter": name}
