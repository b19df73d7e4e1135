"""Lean decode steps: one new token per session through a span's layers, no generation machinery.

For Llama-shaped layers (llama, qwen2, qwen3, mistral, and the MoE mixtral and qwen3_moe, whose
MLP is their sparse block), Gemma 2 / Gemma 3's (the same attention inputs; norms after
attention and around the MLP; Gemma 2's attention logits capped) and Falcon's with rotary (one
fused query_key_value product; attention and MLP in parallel or in turn) a decode step (T = 1)
calls each layer's own modules directly: norms, projections, rotary (one per layer type for
Gemma 3), attention over the session's keys/values, MLP. A sliding-window layer attends the
last `sliding_window` slots of its past, a view: its cache records the whole past
(drift.models.cache), as the eager path's does. Keys/values grow in a preallocated buffer per
session and layer (`KVBuffers`), whose prefix view is the DynamicCache layer's keys/values, so
prefill, rollback, beam reorder and batching (drift.models.batch) keep working on the cache as
before.
Sessions stepping together share the projections and MLP (one weight read) while each attends
its own past (no past is copied). `refusal` says what it does not cover: run the eager path.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from drift.models.batch import BatchStep
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
    if quant != "none":
        return f"{quant}-quantized weights"
    return None


def _falcon_refusal(config: Any) -> str | None:
    if config.alibi:
        return "falcon with ALiBi"
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


# The dense parts of one layer, between attentions: plain functions of the layer's modules, so
# torch.compile (drift.server.compiled) may compile them once for every layer of the span.
def attn_inputs(layer: Any, h: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """h [R, 1, H] -> rotated q [R, Hq, 1, D], k [R, Hkv, 1, D] and v [R, Hkv, 1, D]."""
    attn = layer.self_attn
    x = layer.input_layernorm(h)
    shape = (h.shape[0], 1, -1, attn.head_dim)
    q, k = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape)
    if hasattr(attn, "q_norm"):  # qwen3: per-head norms before rotary
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), attn.v_proj(x).view(shape).transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [R, 1, 1, D]
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s, v


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attn_outputs(layer: Any, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Residual stream h [R, 1, H] after attention output attn [R, Hq, 1, D] and the MLP."""
    h = h + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(h.shape[0], 1, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def gemma_attn_outputs(layer: Any, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """attn_outputs for Gemma 2 / 3: a norm after attention, and norms before and after the MLP."""
    a = layer.self_attn.o_proj(attn.transpose(1, 2).reshape(h.shape[0], 1, -1))
    h = h + layer.post_attention_layernorm(a)
    return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))


def _falcon_split(config: Any) -> bool:
    """Falcon 40B / 180B: attention and MLP each with its own norm (ln_attn, ln_mlp)."""
    return bool(config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2)


def falcon_attn_inputs(
    layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attn_inputs for Falcon: one fused query_key_value product, split as its layout says."""
    attn, config = layer.self_attention, layer.config
    x = layer.ln_attn(h) if _falcon_split(config) else layer.input_layernorm(h)
    rows, d = h.shape[0], attn.head_dim
    fused = attn.query_key_value(x).view(rows, 1, -1, d)
    if attn.new_decoder_architecture:  # per kv group: its queries, then its key and value
        grouped = fused.view(rows, 1, attn.num_kv_heads, -1, d)
        q, k, v = grouped[..., :-2, :].flatten(-3, -2), grouped[..., -2, :], grouped[..., -1, :]
    elif attn.multi_query:  # Falcon 7B: one key/value head
        q, k, v = fused.split([attn.num_heads, 1, 1], dim=-2)
    else:  # query, key and value interleaved per head
        q, k, v = fused.unflatten(-2, (attn.num_heads, 3)).unbind(-2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s, v


def falcon_attn_outputs(layer: Any, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """attn_outputs for Falcon: attention and MLP in parallel (7B, 40B, 180B), or in turn."""
    config = layer.config
    a = layer.self_attention.dense(attn.transpose(1, 2).reshape(h.shape[0], 1, -1))
    if _falcon_split(config):
        return h + (layer.mlp(layer.ln_mlp(h)) + a)
    if config.parallel_attn:
        return h + (layer.mlp(layer.input_layernorm(h)) + a)
    r = h + a
    return r + layer.mlp(layer.post_attention_layernorm(r))


def dense_parts(span: SpanLayers) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The span's (attention inputs, attention outputs + MLP) functions."""
    if all(type(layer).__name__ == "FalconDecoderLayer" for layer in span.layers):
        return falcon_attn_inputs, falcon_attn_outputs
    gemma = all(hasattr(layer, "pre_feedforward_layernorm") for layer in span.layers)
    return attn_inputs, gemma_attn_outputs if gemma else attn_outputs


def _attention(layer: Any) -> Any:
    """The layer's attention module (Falcon names it self_attention)."""
    return layer.self_attn if hasattr(layer, "self_attn") else layer.self_attention


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           scale: float, softcap: float | None) -> torch.Tensor:  # fmt: skip
    """q [b, Hq, 1, D] over keys/values [b, Hkv, n, D] (mask [b, 1, 1, n] bool or None);
    with `softcap`, logits are capped (cap * tanh(logits / cap)) before the softmax, as
    transformers' eager attention does for Gemma 2 (sdpa has no such step)."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                              enable_gqa=True)  # fmt: skip
    b, hq, _, d = q.shape
    hkv = keys.shape[1]
    grouped = q.reshape(b, hkv, hq // hkv, d)  # q head i*g + j reads kv head i (repeat_kv)
    logits = torch.matmul(grouped, keys.transpose(-1, -2)) * scale
    logits = torch.tanh(logits / softcap) * softcap
    if mask is not None:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values).reshape(b, hq, 1, d)


Part = Callable[..., Any]


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

    def __init__(self, span: SpanLayers, *, pre: Part | None = None, post: Part | None = None,
                 ) -> None:  # fmt: skip
        self.span = span
        self.rotary = span.aux.get_submodule("rotary_emb")  # type: ignore[attr-defined]
        # Gemma 3: one rotary per layer type (rotary_emb(h, positions, layer_type))
        self.typed_rotary = "layer_type" in inspect.signature(self.rotary.forward).parameters
        plain_pre, plain_post = dense_parts(span)
        self.pre, self.post = pre or plain_pre, post or plain_post  # plain, or compiled
        self.buffers = KVBuffers()
        first = span.start_block
        self.kinds = {i: span.adapter.layer_type(i) for i in range(first, first + len(span.layers))}
        self.windows = {i: window_of(span, i) for i in self.kinds}
        softcap = getattr(span.config, "attn_logit_softcapping", None)
        self.softcap = float(softcap) if softcap else None

    def takes(self, steps: Sequence[BatchStep]) -> bool:
        """Steps this decoder runs: one token per row, distinct sessions of this span."""
        return all(
            st.session.span is self.span and int(st.hidden.shape[1]) == 1 for st in steps
        ) and len({id(st.session) for st in steps}) == len(steps)

    def run(self, steps: Sequence[BatchStep]) -> list[torch.Tensor]:
        """Like drift.models.batch.run_steps: each output [b, 1, H] in its step's dtype; a
        failure leaves every session as it was before the call."""
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
        span = self.span
        kinds = {self.kinds[i] for i in sessions[0].layer_ids}
        if self.typed_rotary:
            rotary = {kind: self.rotary(h, positions, kind) for kind in kinds}  # [R, 1, D]
        else:
            rotary = dict.fromkeys(kinds, self.rotary(h, positions))
        rows = [int(m.shape[0]) for m in masks]
        # a row's mask is needed only where it holds left padding
        attn_masks = [None if bool(m.all()) else m[:, None, None, :] for m in masks]
        for index in sessions[0].layer_ids:
            layer = span.layers[index - span.start_block]
            q, k, v = self.pre(layer, h, *rotary[self.kinds[index]])
            window, scale = self.windows[index], _attention(layer).scaling
            outs, row = [], 0
            for s, b, mask in zip(sessions, rows, attn_masks, strict=True):
                keys, values = self.buffers.append(
                    s.cache.layers[index], k[row : row + b], v[row : row + b], s.max_length
                )
                if window is not None and keys.shape[-2] > window:  # the last `window` slots
                    keys, values = keys[:, :, -window:], values[:, :, -window:]
                    mask = None if mask is None else mask[..., -window:]
                outs.append(attend(q[row : row + b], keys, values, mask, scale, self.softcap))
                row += b
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            h = self.post(layer, h, attn)
        return h
