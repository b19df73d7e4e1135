"""Validation of what callers hand a span: shapes, ranks, sizes and sub-span ranges.

Every check raises a drift.wire.errors class naming the problem; nothing here runs layers.
"""

from __future__ import annotations

import torch

from drift.wire.errors import BadTensor, SpanNotServed


def check_range(
    start: int | None, end: int | None, served_start: int, served_end: int
) -> tuple[int, int]:
    """The half-open sub-span [start, end) of [served_start, served_end), defaults filled in."""
    start = served_start if start is None else int(start)
    end = served_end if end is None else int(end)
    if not served_start <= start < end <= served_end:
        raise SpanNotServed(
            f"blocks [{start}, {end}) are not inside the served span [{served_start}, {served_end})"
        )
    return start, end


def check_hidden(hidden: torch.Tensor, hidden_size: int, name: str = "hidden_states") -> None:
    if not isinstance(hidden, torch.Tensor):
        raise BadTensor(f"{name} must be a tensor, got {type(hidden).__name__}")
    if hidden.ndim != 3:
        raise BadTensor(
            f"{name} must have rank 3 [batch, tokens, hidden], got {tuple(hidden.shape)}"
        )
    if not hidden.is_floating_point():
        raise BadTensor(f"{name} must be floating point, got {hidden.dtype}")
    if hidden.shape[-1] != hidden_size:
        raise BadTensor(
            f"{name} hidden size {hidden.shape[-1]} does not match the model's {hidden_size}"
        )
    if hidden.shape[0] < 1 or hidden.shape[1] < 1:
        raise BadTensor(f"{name} must hold at least one token, got {tuple(hidden.shape)}")


def check_mask(mask: torch.Tensor | None, batch: int, tokens: int) -> torch.Tensor | None:
    """A [B, T] 0/1 mask as bool, or None."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (batch, tokens):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise BadTensor(f"attention_mask must have shape [{batch}, {tokens}], got {shape}")
    if mask.is_floating_point() or mask.is_complex():
        mask = mask.round()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise BadTensor("attention_mask must hold only 0 (padding) and 1 (token)")
    return mask.to(torch.bool)


def check_prompts(
    prompts: torch.Tensor | None, n_blocks: int, batch: int, hidden_size: int
) -> None:
    if prompts is None:
        return
    if not isinstance(prompts, torch.Tensor) or prompts.ndim != 4:
        shape = (
            tuple(prompts.shape) if isinstance(prompts, torch.Tensor) else type(prompts).__name__
        )
        raise BadTensor(f"prompts must have rank 4 [blocks, batch, length, hidden], got {shape}")
    if not prompts.is_floating_point():
        raise BadTensor(f"prompts must be floating point, got {prompts.dtype}")
    blocks, b, _, h = prompts.shape
    if blocks != n_blocks or b not in (1, batch) or h != hidden_size:
        raise BadTensor(
            f"prompts must have shape [{n_blocks}, {batch}, P, {hidden_size}], "
            f"got {tuple(prompts.shape)}"
        )


def check_hypo_ids(hypo_ids: torch.Tensor | None, batch: int) -> torch.Tensor | None:
    if hypo_ids is None:
        return None
    if not isinstance(hypo_ids, torch.Tensor) or tuple(hypo_ids.shape) != (batch,):
        raise BadTensor(f"hypo_ids must have shape [{batch}]")
    if hypo_ids.is_floating_point() or hypo_ids.dtype == torch.bool:
        raise BadTensor(f"hypo_ids must be integers, got {hypo_ids.dtype}")
    if bool(((hypo_ids < 0) | (hypo_ids >= batch)).any()):
        raise BadTensor(f"hypo_ids must lie in [0, {batch})")
    return hypo_ids.long()
