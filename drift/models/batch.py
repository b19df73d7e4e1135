"""One forward for the steps of several sessions over the same blocks (server-side batching).

Each session keeps its own KV cache, mask and position. `run_steps` left-pads their pasts to
the longest one into a temporary batched cache, with the padding masked out of the 2D mask
(positions come from the mask's cumsum, so rotary and ALiBi see each row's own positions,
and a sliding window shifted by a row's padding covers the same tokens), runs the layers once
and appends each session's new keys and values to its own cache. A session's output does not
depend on who it ran with (up to float reduction order). Steps taking named tensors (Gemma
4), deep prompts or a beam reorder are not batched: `batchable` says which may be. Steps
over long pasts run one by one (`worth_batching`): copying those pasts costs more than the
weight reads a batch saves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin

from drift.models.cache import new_cache
from drift.models.session import SpanSession


@dataclass(frozen=True)
class BatchStep:
    """A validated plain step of one session: hidden [b, T, H] at `position`."""

    session: SpanSession
    position: int
    hidden: torch.Tensor
    attention_mask: torch.Tensor | None = None  # [b, T]


def batchable(session: SpanSession) -> bool:
    """Whether the session's blocks can run in a batch with others: no K/V sharing between
    blocks and no named tensors beside the hidden states (not Gemma 4)."""
    spec = session.span.extra_spec(session.start_block, session.end_block)
    return not session.span.adapter.sharing.consumers and not spec.inputs and not spec.donors


def batch_key(step: BatchStep) -> tuple[int, int, int, int]:
    """Steps with equal keys may run together: the same span object, blocks and tokens."""
    s = step.session
    return id(s.span), s.start_block, s.end_block, int(step.hidden.shape[1])


def run_steps(steps: list[BatchStep]) -> list[torch.Tensor]:
    """Run steps of distinct sessions with equal `batch_key` as one forward; each output
    [b, T, H] in its step's dtype (or one by one, where `worth_batching` says no). Raises
    what a session's own checks raise (closed, position past the end); a failure leaves
    every cache as it was before the call (rolled back to the step's position)."""
    if len(steps) == 1 or not worth_batching(steps):  # each session's own path
        return _one_by_one(steps)
    sessions = [step.session for step in steps]
    assert len({id(s) for s in sessions}) == len(sessions), "one step per session"
    masks = [s.prepare(st.position, st.hidden, None, st.attention_mask)
             for s, st in zip(sessions, steps, strict=True)]  # fmt: skip
    span, tokens = sessions[0].span, int(steps[0].hidden.shape[1])
    past = max(m.shape[1] for m in masks) - tokens
    mask_2d = torch.cat([_left_pad(m, past + tokens, False) for m in masks], dim=0)
    cache = _padded_cache(sessions, past)
    hidden = torch.cat([st.hidden.to(span.device, span.dtype) for st in steps], dim=0)
    with torch.no_grad():
        out, _ = span.run_layers(sessions[0].layer_ids, hidden, mask_2d, cache, None, 0)
    outs, row = [], 0
    try:
        for s, st, m in zip(sessions, steps, masks, strict=True):
            rows = slice(row, row + st.hidden.shape[0])
            _append_new(s, cache, rows, past, tokens)
            s.commit(m)
            outs.append(out[rows].to(st.hidden.dtype))
            row = rows.stop
    except Exception:
        for s, st in zip(sessions, steps, strict=True):
            s.rollback(st.position)
        raise
    return outs


def worth_batching(steps: list[BatchStep]) -> bool:
    """Whether one forward beats each session's own: it reads the blocks' weights once
    instead of once per step, but copies every session's past, left-padded to the longest,
    into a temporary cache (and on through the layers' update), which a session's own step
    does not. Measured on a CPU (SmolLM2, 15 blocks, float32, 2 and 4 sessions at pasts of
    128 to 4,096 tokens) it pays while COPY_COST times the bytes of past copied stay under
    the bytes of weights the batch saves reading: at 2 sessions to about 700 past tokens."""
    session = steps[0].session
    per_token = max(_kv_bytes_per_token(st.session.cache, session.layer_ids) for st in steps)
    if per_token == 0:  # no session holds a past yet
        return True
    rows = sum(int(st.hidden.shape[0]) for st in steps)
    copied = rows * max(st.position for st in steps) * per_token
    span = session.span
    weights = sum(p.numel() * p.element_size()
                  for i in session.layer_ids
                  for p in span.layers[i - span.start_block].parameters())  # fmt: skip
    return COPY_COST * copied <= (len(steps) - 1) * weights


COPY_COST = 5  # a byte of past copied costs about as much as this many bytes of weights read


def _kv_bytes_per_token(cache: DynamicCache, layer_ids: tuple[int, ...]) -> int:
    """Bytes of keys and values one cached token takes over `layer_ids` (0: none cached)."""
    total = 0
    for index in layer_ids:
        kv = _kv(cache, index)
        if kv is not None:
            k, v = kv
            total += (k[0, ..., 0, :].numel() + v[0, ..., 0, :].numel()) * k.element_size()
    return total


def _one_by_one(steps: list[BatchStep]) -> list[torch.Tensor]:
    """Each step on its session's own path; a failure rolls back the steps run before it."""
    outs: list[torch.Tensor] = []
    try:
        for step in steps:
            out, _ = step.session.run(step.position, step.hidden,
                                      attention_mask=step.attention_mask)  # fmt: skip
            outs.append(out)
    except Exception:
        for step in steps[: len(outs)]:
            step.session.rollback(step.position)
        raise
    return outs


def _left_pad(t: torch.Tensor, length: int, value: bool | float, dim: int = 1) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.full(shape, value, dtype=t.dtype, device=t.device), t], dim=dim)


def _padded_cache(sessions: list[SpanSession], past: int) -> DynamicCache:
    """A fresh cache whose span layers hold every session's past, left-padded to `past`."""
    cache = new_cache(sessions[0].span.config)
    if past == 0:
        return cache
    for index in sessions[0].layer_ids:
        stored = [_kv(s.cache, index) for s in sessions]
        like = next(kv for kv in stored if kv is not None)
        keys, values = [], []
        for s, kv in zip(sessions, stored, strict=True):
            k, v = kv if kv is not None else (_no_tokens(like[0], s.batch_size),
                                              _no_tokens(like[1], s.batch_size))  # fmt: skip
            keys.append(_left_pad(k, past, 0.0, dim=-2))
            values.append(_left_pad(v, past, 0.0, dim=-2))
        _layer(cache, index).update(torch.cat(keys), torch.cat(values))
    return cache


def _layer(cache: DynamicCache, index: int) -> CacheLayerMixin:
    layer = cache.layers[index]
    if not isinstance(layer, CacheLayerMixin):
        raise TypeError(f"{type(layer).__name__} holds no key/value cache to batch")
    return layer


def _kv(cache: DynamicCache, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Layer `index`'s cached keys and values, or None when it holds no token yet."""
    layer = _layer(cache, index)
    k, v = layer.keys, layer.values
    if not layer.is_initialized or k is None or v is None or k.shape[-2] == 0:
        return None
    return k, v


def _no_tokens(like: torch.Tensor, batch: int) -> torch.Tensor:
    return like.new_zeros(batch, *like.shape[1:-2], 0, like.shape[-1])


def _append_new(session: SpanSession, cache: DynamicCache, rows: slice, past: int,
                tokens: int) -> None:  # fmt: skip
    """The keys and values of the step's tokens, from the batched cache into the session's."""
    for index in session.layer_ids:
        kv = _kv(cache, index)
        assert kv is not None
        k, v = (t[rows, ..., past : past + tokens, :] for t in kv)
        _layer(session.cache, index).update(k, v)
