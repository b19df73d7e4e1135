"""SpanSession: one client's KV cache over a (sub-)span, fed a prompt and then new tokens.

It keeps the growing 2D mask [B, position] (left padding, ALiBi), rolls back to an earlier
position, reorders rows for beam search, and refuses to grow past max_length. The layers
themselves run in ModelSpan.run_layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from drift.models.cache import cache_length, new_cache, reorder, rollback
from drift.models.inputs import check_hidden, check_hypo_ids, check_mask, check_prompts
from drift.wire.errors import BadRequest, BadTensor, LengthExceeded

if TYPE_CHECKING:
    from drift.models.span import ModelSpan


class SpanSession:
    """KV cache + 2D mask for blocks [start_block, end_block) of a loaded span."""

    def __init__(
        self,
        span: ModelSpan,
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
        self.layer_ids = tuple(range(start_block, end_block))
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
    ) -> torch.Tensor:
        """hidden [B, T, H] at `position` (default: the end) -> [B, T, H] in hidden's dtype."""
        if self.closed:
            raise BadRequest("this inference session is closed")
        check_hidden(hidden, self.span.adapter.hidden_size)
        batch, tokens = hidden.shape[:2]
        if batch != self.batch_size:
            raise BadTensor(f"session batch size is {self.batch_size}, got {batch}")
        start = self.position if position is None else int(position)
        if start < 0 or start > self.position:
            raise LengthExceeded(
                f"step at position {start}, but the session holds {self.position} tokens"
            )
        if start + tokens > self.max_length:
            raise LengthExceeded(
                f"{start} + {tokens} tokens exceeds the session's max_length {self.max_length}"
            )
        new_mask = check_mask(attention_mask, batch, tokens)
        if new_mask is None:
            new_mask = torch.ones(batch, tokens, dtype=torch.bool)
        check_prompts(prompts, len(self.layer_ids), batch, self.span.adapter.hidden_size)
        hypo = check_hypo_ids(hypo_ids, batch)
        if start < self.position:
            self._rollback(start)
        if hypo is not None:
            hypo = hypo.to(self.span.device)
            reorder(self.cache, hypo)
            self.mask = self.mask[hypo]
        mask_2d = torch.cat([self.mask, new_mask.to(self.span.device)], dim=1)  # [B, past + T]
        span_prompts = None if prompts is None else prompts.to(self.span.device, self.span.dtype)
        inputs = hidden.to(self.span.device, self.span.dtype)
        try:
            with torch.no_grad():
                out = self.span.run_layers(
                    self.layer_ids, inputs, mask_2d, self.cache, span_prompts, start
                )
        except Exception:
            rollback(self.cache, start)  # leave the session as it was before this step
            raise
        self.mask, self.position = mask_2d, start + tokens
        assert cache_length(self.cache, self.start_block) == self.position
        return out.to(hidden.dtype)

    def _rollback(self, position: int) -> None:
        rollback(self.cache, position)
        self.mask = self.mask[:, :position]
        self.position = position

    def close(self) -> None:
        self.closed = True
        self.cache = new_cache(self.span.config)
        self.mask = self.mask[:, :0]
        self.position = 0
