"""Cutting long compute into chunks, so the compute thread runs other requests in between.

A pass over [B, T] tokens is split into groups of rows holding at most `chunk_tokens` tokens;
a single row longer than that runs token-chunk by token-chunk through a temporary KV cache
(a chunked prefill: the same numbers as one pass). Backward splits rows only. Each chunk is
one call the caller submits to the compute thread on its own, awaiting it before the next.
Pure torch bookkeeping; knows nothing about threads or HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Chunk = Callable[[], Any]  # one unit of torch work for the compute thread
# One unit of work should take about this long at the span's measured pace: a decode step of
# another session waits behind at most one unit (clients time steps out after 2 s at least).
CHUNK_TARGET_S = 1.0
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 64, 1024


def chunk_tokens_for(pace: float, n_blocks: int) -> int:
    """Tokens per unit of compute-thread work for a span of `n_blocks` blocks that runs
    `pace` block-tokens/s (measured on 16 tokens: a prefill runs faster, so a unit takes
    less than CHUNK_TARGET_S): the largest power of two that fits, in [MIN, MAX].

    SmolLM2 float32 [0, 15) on one CPU core: 256 tokens, units of ~0.64 s (1,024 took 2.4 s,
    past a client's step timeout), the same 4.0 s for a 2,048-token prefill; a GPU: 1,024."""
    fits = min(pace * CHUNK_TARGET_S / max(n_blocks, 1), MAX_CHUNK_TOKENS)
    tokens = MIN_CHUNK_TOKENS
    while tokens * 2 <= fits:
        tokens *= 2
    return tokens


@dataclass(frozen=True)
class RowGroup:
    rows: slice  # rows of the batch
    hidden: torch.Tensor  # [b, T, H]
    mask: torch.Tensor | None  # [b, T]
    prompts: torch.Tensor | None  # [n_blocks, b or 1, P, H]
    grad: torch.Tensor | None = None  # [b, T, H] (backward)


def row_groups(hidden: torch.Tensor, mask: torch.Tensor | None, prompts: torch.Tensor | None,
               chunk_tokens: int, grad: torch.Tensor | None = None) -> list[RowGroup]:  # fmt: skip
    """Consecutive rows holding at most `chunk_tokens` tokens each (at least one row)."""
    batch, tokens = hidden.shape[:2]
    per = max(1, chunk_tokens // max(tokens, 1))
    out = []
    for start in range(0, batch, per):
        rows = slice(start, min(batch, start + per))
        rows_prompts = prompts if prompts is None or prompts.shape[1] == 1 else prompts[:, rows]
        out.append(RowGroup(rows, hidden[rows], None if mask is None else mask[rows],
                            rows_prompts,
                            None if grad is None else grad[rows]))  # fmt: skip
    return out


def forward_chunks(span: Any, start: int, end: int, group: RowGroup,
                   chunk_tokens: int) -> Iterator[Chunk]:  # fmt: skip
    """Units computing `group` through blocks [start, end); the last one returns [b, T, H]."""
    tokens = group.hidden.shape[1]
    if tokens <= chunk_tokens:
        yield lambda: span.run_forward(start, end, group.hidden, group.mask, group.prompts)[0]
        return
    state: dict[str, Any] = {"outs": []}

    def open_cache() -> None:
        state["session"] = span.new_session(batch_size=group.hidden.shape[0], max_length=tokens,
                                            start_block=start, end_block=end)  # fmt: skip

    yield open_cache
    for pos in range(0, tokens, chunk_tokens):
        yield _prefill_unit(state, group, pos, min(tokens, pos + chunk_tokens))

    def finish() -> torch.Tensor:
        state.pop("session").close()
        return torch.cat(state["outs"], dim=1)

    yield finish


def _prefill_unit(state: dict[str, Any], group: RowGroup, pos: int, stop: int) -> Chunk:
    def unit() -> None:
        mask = None if group.mask is None else group.mask[:, pos:stop]
        out, _ = state["session"].run(pos, group.hidden[:, pos:stop], attention_mask=mask,
                                      prompts=group.prompts)  # fmt: skip
        state["outs"].append(out)

    return unit


def merge_grad_prompts(parts: list[torch.Tensor | None], prompts: torch.Tensor | None,
                       ) -> torch.Tensor | None:  # fmt: skip
    """Gradients of deep prompts from row groups: summed when shared, else concatenated."""
    if prompts is None or any(p is None for p in parts):
        return None
    tensors = [p for p in parts if p is not None]
    if prompts.shape[1] == 1:
        return torch.stack(tensors).sum(dim=0)
    return torch.cat(tensors, dim=1)
