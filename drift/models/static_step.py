"""Lean decode steps: one new token per session through a span's layers, no generation machinery.

For the layers in LEAN_LAYERS a decode step (T = 1) calls each layer's own modules directly
(drift.models.lean_layers has each family's parts): norms, projections, rotary (one per layer type
for Gemma 3), attention over the session's keys/values, MLP. A sliding-window layer attends the
last `sliding_window` slots of its past, a view: its cache records the whole past
(drift.models.cache), as the eager path's does. Keys/values grow in a preallocated buffer per
session and layer (`KVBuffers`), whose prefix view is the DynamicCache layer's keys/values, so
prefill, rollback, beam reorder and batching (drift.models.batch) keep working on the cache as
before.
Sessions stepping together share the projections and MLP (one weight read) while each attends
its own past (no past is copied); their rows are padded with zero rows per `row_pads` (measured
by the server, drift.models.rows: 2-3 float32 rows cost the BLAS a weight read each), which no
session attends. `refusal` says what it does not cover: run the eager path.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from drift.models.batch import BatchStep
from drift.models.lean_layers import LayerParts, parts_of, scale_of
from drift.models.rows import RowPads, pad, padded
from drift.models.session import SpanLayers, SpanSession
from drift.models.span import positions_from_mask

LEAN_LAYERS = (
    "LlamaDecoderLayer",
    "Qwen2DecoderLayer",
    "Qwen3DecoderLayer",
    "MistralDecoderLayer",
    "MixtralDecoderLayer",
    "Qwen3MoeDecoderLayer",
    "Gemma2DecoderLayer",
    "Gemma3DecoderLayer",
    "FalconDecoderLayer",
    "DeepseekV3DecoderLayer",
    "BloomBlock",
)
LAYER_TYPES = ("full_attention", "sliding_attention")
MIN_ROOM = 64  # tokens: the smallest buffer a session's layer gets


def refusal(span: SpanLayers, quant: str = "none") -> str | None:
    """Why the lean step cannot run this span (None: it can)."""
    kinds = {type(layer).__name__ for layer in span.layers}
    if not kinds <= set(LEAN_LAYERS):
        return f"layers {sorted(kinds - set(LEAN_LAYERS))} (not in LEAN_LAYERS)"
    types = {span.adapter.layer_type(span.start_block + i) for i in range(len(span.layers))}
    if not types <= set(LAYER_TYPES):
        return f"layer types {sorted(types - set(LAYER_TYPES))}"
    if "sliding_attention" in types and not isinstance(
        getattr(span.config, "sliding_window", None), int
    ):
        return "sliding-window layers without a sliding_window size"
    if "FalconDecoderLayer" in kinds and (why := _falcon_refusal(span.config)):
        return why
    if "BloomBlock" in kinds and span.config.pretraining_tp > 1 and span.config.slow_but_exact:
        return "bloom with slow_but_exact (its products split pretraining_tp ways)"
    if quant != "none":
        return f"{quant}-quantized weights"
    return None


def _falcon_refusal(config: Any) -> str | None:
    if (
        config.new_decoder_architecture
        and config.num_ln_in_parallel_attn != 2
        and not config.parallel_attn
    ):
        return "falcon's new architecture with one norm and no parallel attention"
    return None


def window_of(span: SpanLayers, index: int) -> int | None:
    """The tokens layer `index` attends (its sliding window), or None: all of its past."""
    if span.adapter.layer_type(index) == "sliding_attention":
        return int(span.config.sliding_window)
    return None


@dataclass
class _Held:
    keys: torch.Tensor  # [b, H_kv, room, D]
    values: torch.Tensor  # [b, H_kv, room, D]


class KVBuffers:
    """Preallocated key/value room behind DynamicCache layers, keyed by the layer object."""

    def __init__(self) -> None:
        self._held: weakref.WeakKeyDictionary[DynamicLayer, _Held] = weakref.WeakKeyDictionary()

    def append(self, layer: object, k: torch.Tensor, v: torch.Tensor,
               max_length: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Write k, v [b, H_kv, 1, D] after the layer's past; its keys/values become views of
        the buffer (copied into a new one only when the past is not already its prefix)."""
        sliding = isinstance(layer, DynamicSlidingWindowLayer)
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) or (
            sliding and not layer.record_past
        ):
            raise TypeError(f"the lean step keeps no {type(layer).__name__} (whole past needed)")
        if not layer.is_initialized:
            layer.lazy_initialization(k, v)
        past, past_values = layer.keys, layer.values
        n = int(past.shape[-2]) if past is not None and past.numel() else 0
        held = self._held.get(layer)
        if held is None or not _is_prefix(past, held.keys, n) or n + 1 > held.keys.shape[-2]:
            room = max(n + 1, min(max(max_length, n + 1), max(MIN_ROOM, 2 * n)))
            held = _Held(k.new_empty(*k.shape[:2], room, k.shape[-1]),
                         v.new_empty(*v.shape[:2], room, v.shape[-1]))  # fmt: skip
            if n:
                assert past is not None and past_values is not None
                held.keys[:, :, :n].copy_(past)
                held.values[:, :, :n].copy_(past_values)
            self._held[layer] = held
        held.keys[:, :, n].copy_(k[:, :, 0])
        held.values[:, :, n].copy_(v[:, :, 0])
        layer.keys, layer.values = held.keys[:, :, : n + 1], held.values[:, :, : n + 1]
        if sliding:  # it records its whole past: the tokens seen are the tokens kept
            layer.cumulative_length = n + 1
        return layer.keys, layer.values


def _is_prefix(past: torch.Tensor | None, buffer: torch.Tensor, n: int) -> bool:
    """Whether `past` is buffer[:, :, :n] (the view this module set, or a rollback of it)."""
    if n == 0:
        return True
    return (
        past is not None
        and past.data_ptr() == buffer.data_ptr()
        and past.stride() == buffer.stride()
        and past.shape[:2] == buffer.shape[:2]
    )


def relayout_linears(span: SpanLayers) -> int:
    """Store the span's float32 CPU linear weights as [in, out] (the parameter stays the
    [out, in] view of it): MKL's one-row products read that layout ~1.4x faster here (bf16
    reads it ~6x slower, so only float32). Values unchanged; returns the weights moved."""
    if span.dtype != torch.float32 or span.device.type != "cpu":
        return 0
    moved = 0
    for module in span.layers.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear) and weight is not None and weight.is_contiguous():
            module.weight.data = weight.data.t().contiguous().t()
            moved += 1
    return moved


class LeanDecoder:
    """Decode steps (one token per row) of sessions over one span, run directly."""

    def __init__(self, span: SpanLayers, parts: LayerParts | None = None) -> None:
        """`parts`: the span's (parts_of), or those with pre and post compiled."""
        self.span = span
        self.parts = parts or parts_of(span)
        # ALiBi spans have no rotary; Gemma 3 one per layer type (rotary_emb(h, positions, type))
        aux: Any = span.aux
        self.rotary = None if self.parts.bias is not None else aux.get_submodule("rotary_emb")
        self.typed_rotary = (
            self.rotary is not None
            and "layer_type" in inspect.signature(self.rotary.forward).parameters
        )
        self.buffers = KVBuffers()
        first = span.start_block
        self.kinds = {i: span.adapter.layer_type(i) for i in range(first, first + len(span.layers))}
        self.windows = {i: window_of(span, i) for i in self.kinds}
        self.scales = {i: scale_of(span.layers[i - first]) for i in self.kinds}
        self.row_pads: RowPads = {}  # rows -> rows to run them as (drift.models.rows)

    def takes(self, steps: Sequence[BatchStep]) -> bool:
        """Steps this decoder runs: one token per row, no named tensors, distinct sessions of
        this span."""
        return all(
            st.session.span is self.span
            and int(st.hidden.shape[1]) == 1
            and not st.extras
            and not st.donate
            for st in steps
        ) and len({id(st.session) for st in steps}) == len(steps)

    def run(self, steps: Sequence[BatchStep]) -> list[torch.Tensor]:
        """Like drift.models.batch.run_steps, with no named tensors: each output [b, 1, H]
        in its step's dtype; a failure leaves every session as it was before the call."""
        sessions = [st.session for st in steps]
        masks = [s.prepare(st.position, st.hidden, None, st.attention_mask)
                 for s, st in zip(sessions, steps, strict=True)]  # fmt: skip
        span = self.span
        try:
            with torch.no_grad():
                hidden = torch.cat([st.hidden.to(span.device, span.dtype) for st in steps])
                out = self._layers(sessions, masks, hidden)  # [R, 1, H]
        except Exception:
            for s, st in zip(sessions, steps, strict=True):
                s.rollback(st.position)
            raise
        outs, row = [], 0
        for s, st, m in zip(sessions, steps, masks, strict=True):
            s.commit(m)
            outs.append(out[row : row + st.hidden.shape[0]].to(st.hidden.dtype))
            row += st.hidden.shape[0]
        return outs

    def _layers(self, sessions: list[SpanSession], masks: list[torch.Tensor],
                h: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """h [R, 1, H] through every session's layers (all sessions share layer_ids)."""
        positions = torch.cat([positions_from_mask(m, 1) for m in masks])  # [R, 1]
        real = int(h.shape[0])
        extra = padded(self.row_pads, real) - real  # zero rows: products only, never attended
        h, positions = pad(h, real + extra), pad(positions, real + extra)
        span = self.span
        kinds = {self.kinds[i] for i in sessions[0].layer_ids}
        if self.rotary is None:
            rotary = dict.fromkeys(kinds, (None, None))
        elif self.typed_rotary:
            rotary = {kind: self.rotary(h, positions, kind) for kind in kinds}  # [R, 1, D]
        else:
            rotary = dict.fromkeys(kinds, self.rotary(h, positions))
        rows = [int(m.shape[0]) for m in masks]
        bias = self.parts.bias
        if bias is not None:  # ALiBi: each session's biases, computed once for every layer
            attn_masks = [bias(m, h.dtype) for m in masks]
        else:  # a row's mask is needed only where it holds left padding
            attn_masks = [None if bool(m.all()) else m[:, None, None, :] for m in masks]
        pre, attend, post = self.parts.pre, self.parts.attend, self.parts.post
        for index in sessions[0].layer_ids:
            layer = span.layers[index - span.start_block]
            q, k, v = pre(layer, h, *rotary[self.kinds[index]])
            window, scale = self.windows[index], self.scales[index]
            outs, row = [], 0
            for s, b, mask in zip(sessions, rows, attn_masks, strict=True):
                keys, values = self.buffers.append(
                    s.cache.layers[index], k[row : row + b], v[row : row + b], s.max_length
                )
                if window is not None and keys.shape[-2] > window:  # the last `window` slots
                    keys, values = keys[:, :, -window:], values[:, :, -window:]
                    mask = None if mask is None else mask[..., -window:]
                outs.append(attend(q[row : row + b], keys, values, mask, scale))
                row += b
            if extra:
                outs.append(outs[0].new_zeros(extra, *outs[0].shape[1:]))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            h = post(layer, h, attn)
        return h[:real]
