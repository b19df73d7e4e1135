"""SpanSession: one client's KV cache over a (sub-)span, fed a prompt and then new tokens.

It keeps the growing 2D mask [B, position] (left padding, ALiBi), rolls back to an earlier
position, reorders rows for beam search, and refuses to grow past max_length (which `grow`
raises in place, keeping what the session holds). `step` takes
loose tensors and validates them (drift.wire.checks, the same checks the wire edge runs);
`run` takes a step already validated there and trusts it. The layers run in the span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from drift.models.cache import cache_length, fork_prefix, new_cache, reorder, rollback
from drift.wire.checks import StepLimits, check_pass, check_step_limits
from drift.wire.errors import BadRequest, LengthExceeded
from drift.wire.extras import ExtraSpec


class SpanLayers(Protocol):
    """What a session needs of its span (drift.models.span.ModelSpan)."""

    config: Any
    device: torch.device
    dtype: torch.dtype
    start_block: int
    layers: Any  # the span's decoder layers, indexed from start_block

    @property
    def adapter(self) -> Any: ...

    def run_layers(self, layer_ids: tuple[int, ...], hidden: torch.Tensor,
                   mask_2d: torch.Tensor, cache: Any, prompts: torch.Tensor | None,
                   offset: int, extras: Mapping[str, torch.Tensor] | None = None,
                   donate: tuple[int, ...] = (),
                   states: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...  # fmt: skip

    def extra_spec(self, start_block: int, end_block: int) -> ExtraSpec: ...


class SpanSession:
    """KV cache + 2D mask for blocks [start_block, end_block) of a loaded span."""

    def __init__(
        self,
        span: SpanLayers,
        start_block: int,
        end_block: int,
        *,
        batch_size: int,
        max_length: int,
    ) -> None:
        if int(batch_size) < 1 or int(max_length) < 1:
            raise BadRequest(
                f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}"
            )
        self.span = span
        self.start_block, self.end_block = start_block, end_block
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        self.limits = StepLimits(int(span.adapter.hidden_size), self.batch_size,
                                 self.max_length, end_block - start_block,
                                 extras=span.extra_spec(start_block, end_block))  # fmt: skip
        self.layer_ids = tuple(range(start_block, end_block))
        # the cache layer whose length is the session's (a consumer's: its donor's, Gemma 4)
        self.length_slot = span.adapter.sharing.cache_slot(start_block)
        self.cache = new_cache(span.config)
        self.mask = torch.zeros(self.batch_size, 0, dtype=torch.bool, device=span.device)
        self.position = 0
        self.closed = False

    def step(
        self,
        hidden: torch.Tensor,
        *,
        position: int | None = None,
        hypo_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None,
        extras: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Validate loose tensors, then `run`: hidden [B, T, H] at `position` (default: the
        end) -> [B, T, H] in hidden's dtype. `extras`: what limits.extras says each step takes
        (Gemma 4's per-layer inputs and the new positions' K/V of donors before the span)."""
        start = self.position if position is None else int(position)
        if start < 0:
            raise LengthExceeded(f"step at position {start}: positions start at 0")
        x = check_pass(hidden, attention_mask, prompts, hypo_ids=hypo_ids,
                       hidden_size=self.limits.hidden_size, n_blocks=self.limits.n_blocks,
                       extras=extras, spec=self.limits.extras)  # fmt: skip
        check_step_limits(x, start, self.limits)
        return self.run(start, x.hidden, hypo_ids=x.hypo_ids, attention_mask=x.attention_mask,
                        prompts=x.prompts, extras=x.extras)[0]  # fmt: skip

    def run(
        self,
        position: int,
        hidden: torch.Tensor,
        *,
        hypo_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None,
        extras: Mapping[str, torch.Tensor] | None = None,
        donate: tuple[int, ...] = (),
        states: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A validated step (checks and limits already passed): only the cache's own state is
        checked here. Inputs move to the span's device once. Returns the output [B, T, H] and
        the `donate` blocks' K/V of the new positions (with `states`, also each block's
        output, drift.wire.extras.BLOCK_STATES), in hidden's dtype. Received K/V are
        kept in the cache, so rollback and beam reorder apply to them as to the span's own."""
        mask_2d = self.prepare(position, hidden, hypo_ids, attention_mask)
        device = self.span.device
        span_prompts = None if prompts is None else prompts.to(device, self.span.dtype)
        named = {k: v.to(device, self.span.dtype) for k, v in (extras or {}).items()}
        try:
            with torch.no_grad():
                out, donated = self.span.run_layers(
                    self.layer_ids, hidden.to(device, self.span.dtype), mask_2d, self.cache,
                    span_prompts, position, named, donate, states,
                )  # fmt: skip
        except Exception:
            rollback(self.cache, position)  # leave the session as it was before this step
            raise
        self.commit(mask_2d)
        return out.to(hidden.dtype), {k: v.to(hidden.dtype) for k, v in donated.items()}

    def prepare(
        self, position: int, hidden: torch.Tensor, hypo_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """Before a step at `position`: the session's own checks, the rollback to `position`
        and the beam reorder; returns the step's 2D mask [B, position + T] (not yet kept)."""
        if self.closed:
            raise BadRequest("this inference session is closed")
        if position > self.position:
            raise LengthExceeded(
                f"step at position {position}, but the session holds {self.position} tokens"
            )
        device = self.span.device
        batch, tokens = hidden.shape[:2]
        if position < self.position:
            self.rollback(position)
        if hypo_ids is not None:
            hypo = hypo_ids.to(device)
            reorder(self.cache, hypo)
            self.mask = self.mask[hypo]
        new_mask = (
            torch.ones(batch, tokens, dtype=torch.bool, device=device)
            if attention_mask is None
            else attention_mask.to(device, torch.bool)
        )
        return torch.cat([self.mask, new_mask], dim=1)  # [B, past + T]

    def commit(self, mask_2d: torch.Tensor) -> None:
        """After the cache took a step's keys and values: keep its mask and new position."""
        self.mask, self.position = mask_2d, mask_2d.shape[1]
        assert cache_length(self.cache, self.length_slot) == self.position

    def rollback(self, position: int) -> None:
        """Forget every token at `position` and after (cache, mask and position)."""
        rollback(self.cache, position)
        self.mask = self.mask[:, :position]
        self.position = position

    def grow(self, max_length: int) -> None:
        """Room for `max_length` tokens from now on; the cache, mask and position stay (the
        cache grows as steps come, whatever the limit: nothing is copied here)."""
        if max_length > self.max_length:
            self.max_length = int(max_length)
            self.limits = dataclasses.replace(self.limits, max_length=self.max_length)

    def fork(self, source: SpanSession, tokens: int) -> None:
        """Start every row of this fresh session with the first `tokens` tokens of `source`
        (one row, same span and blocks): a prompt prefix computed once, its keys and values
        copied. Raises BadRequest where that cannot be (and this session stays empty)."""
        if self.position or self.closed or source.closed:
            raise BadRequest("a fork starts a fresh session from an open one")
        if source.span is not self.span or source.layer_ids != self.layer_ids:
            raise BadRequest("a fork copies a session over the same blocks")
        if source.batch_size != 1:
            raise BadRequest(f"a fork copies a one-row session, not {source.batch_size} rows")
        if not 1 <= tokens <= source.position:
            raise BadRequest(f"fork_tokens {tokens}: the session holds {source.position} tokens")
        if tokens > self.max_length:
            raise LengthExceeded(f"fork_tokens {tokens} exceed max_length {self.max_length}")
        if not bool(source.mask[:, :tokens].all()):
            raise BadRequest("a fork copies tokens, not padding")
        spec = self.span.extra_spec(self.start_block, self.end_block)
        if self.span.adapter.sharing.consumers or spec.inputs or spec.donors:
            raise BadRequest("sessions of a model sharing keys/values across blocks "
                             "(Gemma 4) are not forked")  # fmt: skip
        try:
            fork_prefix(source.cache, self.cache, self.layer_ids, tokens, self.batch_size)
        except (TypeError, ValueError) as exc:
            self.cache = new_cache(self.span.config)
            raise BadRequest(f"this session cannot be forked: {exc}") from exc
        self.commit(torch.ones(self.batch_size, tokens, dtype=torch.bool, device=self.span.device))

    def close(self) -> None:
        self.closed = True
        self.cache = new_cache(self.span.config)
        self.mask = self.mask[:, :0]
        self.position = 0
