"""One forward for the steps of several sessions over the same blocks (server-side batching).

Each session keeps its own KV cache, mask and position. `run_steps` left-pads their pasts to
the longest one into a temporary batched cache, with the padding masked out of the 2D mask
(positions come from the mask's cumsum, so rotary and ALiBi see each row's own positions,
and a sliding window shifted by a row's padding covers the same tokens), runs the layers once
and appends each session's new keys and values to its own cache. A session's output does not
depend on who it ran with (up to float reduction order). Gemma 4's steps batch too: their
named tensors (per-layer inputs, the new positions' K/V of donors before the span) are
stacked row-wise, the pasts are those of every cache slot the blocks read (a consumer block
has none of its own: it reads its donor's, drift.models.sharing), and the K/V the span
donates go back to each step by rows. Deep prompts and beam reorders are not batched (the
server runs such steps alone). Steps over long pasts run one by one (`worth_batching`):
copying those pasts costs more than the weight reads a batch saves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin

from drift.models.cache import new_cache
from drift.models.session import SpanSession


@dataclass(frozen=True)
class BatchStep:
    """A validated step of one session: hidden [b, T, H] at `position`, the named tensors
    its blocks take (drift.wire.extras: Gemma 4's per-layer inputs [b, T, n, P] and donors'
    K/V [b, heads, T, D]) and the donors whose new K/V it asks back (`donate`)."""

    session: SpanSession
    position: int
    hidden: torch.Tensor
    attention_mask: torch.Tensor | None = None  # [b, T]
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)
    donate: tuple[int, ...] = ()


StepOut = tuple[torch.Tensor, dict[str, torch.Tensor]]  # output [b, T, H], donated K/V by name


def batch_key(step: BatchStep) -> tuple[object, ...]:
    """Steps with equal keys may run together: the same span object, blocks and tokens, and
    the same named tensors in and out."""
    s = step.session
    return (id(s.span), s.start_block, s.end_block, int(step.hidden.shape[1]),
            tuple(sorted(step.extras)), step.donate)  # fmt: skip


def run_steps(steps: list[BatchStep]) -> list[StepOut]:
    """Run steps of distinct sessions with equal `batch_key` as one forward (or one by one,
    where `worth_batching` says no); each step's output [b, T, H] and donated K/V, in its
    hidden's dtype. Raises what a session's own checks raise (closed, position past the
    end); a failure leaves every cache as it was before the call (rolled back to the step's
    position)."""
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
    named = {name: torch.cat([st.extras[name].to(span.device, span.dtype) for st in steps])
             for name in steps[0].extras}  # fmt: skip
    with torch.no_grad():
        out, donated = span.run_layers(sessions[0].layer_ids, hidden, mask_2d, cache, None, 0,
                                       named, steps[0].donate)  # fmt: skip
    outs: list[StepOut] = []
    row = 0
    try:
        for s, st, m in zip(sessions, steps, masks, strict=True):
            rows = slice(row, row + st.hidden.shape[0])
            _append_new(s, cache, rows, past, tokens)
            s.commit(m)
            dtype = st.hidden.dtype
            outs.append((out[rows].to(dtype), {k: v[rows].to(dtype) for k, v in donated.items()}))
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
    slots = cache_slots(session)
    per_token = max(_kv_bytes_per_token(st.session.cache, slots) for st in steps)
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


def cache_slots(session: SpanSession) -> tuple[int, ...]:
    """The cache layers a session's blocks read: each block's own, or its donor's (Gemma 4's
    consumers keep none of their own; a donor before the span is kept in its slot)."""
    sharing = session.span.adapter.sharing
    return tuple(sorted({sharing.cache_slot(i) for i in session.layer_ids}))


def _kv_bytes_per_token(cache: DynamicCache, slots: tuple[int, ...]) -> int:
    """Bytes of keys and values one cached token takes over `slots` (0: none cached)."""
    total = 0
    for index in slots:
        kv = _kv(cache, index)
        if kv is not None:
            k, v = kv
            total += (k[0, ..., 0, :].numel() + v[0, ..., 0, :].numel()) * k.element_size()
    return total


def _one_by_one(steps: list[BatchStep]) -> list[StepOut]:
    """Each step on its session's own path; a failure rolls back the steps run before it."""
    outs: list[StepOut] = []
    try:
        for step in steps:
            outs.append(step.session.run(step.position, step.hidden,
                                         attention_mask=step.attention_mask,
                                         extras=step.extras, donate=step.donate))  # fmt: skip
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
    """A fresh cache whose slots (`cache_slots`) hold every session's past, left-padded to
    `past`."""
    cache = new_cache(sessions[0].span.config)
    if past == 0:
        return cache
    for index in cache_slots(sessions[0]):
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
    for index in cache_slots(session):
        kv = _kv(cache, index)
        assert kv is not None
        k, v = (t[rows, ..., past : past + tokens, :] for t in kv)
        _layer(session.cache, index).update(k, v)
