"""The per-family parts of a lean decode step (drift.models.static_step): one layer's work for
one new token per row, calling the layer's own modules.

Each family has three parts: `pre` (norm, projections, rotary: h -> q, k, v), `attend` (q over a
session's keys/values) and `post` (attention output, residuals, norms, MLP). `pre` and `post` are
plain functions of the layer's modules, so torch.compile (drift.server.compiled) may compile them
once for every layer of a span. Families:
- Llama-shaped (llama, qwen2, qwen3, mistral; mixtral and qwen3_moe, whose MLP is their sparse
  block): `attn_inputs`, `attend`, `attn_outputs`.
- Gemma 2 / Gemma 3: the same inputs; a norm after attention and norms around the MLP
  (`gemma_attn_outputs`); Gemma 2's attention logits capped in `attend`.
- Falcon: one fused query_key_value product (`falcon_attn_inputs`), attention and MLP
  in parallel or in turn (`falcon_attn_outputs`).
- Bloom and ALiBi Falcon: positions as attention biases (`alibi_bias`), the family's own; Bloom's
  residuals added inside its attention and MLP (`bloom_attn_outputs`).
- DeepSeek-V2/V3's multi-head latent attention: `mla_attn_inputs`, `mla_attend`,
  `mla_attn_outputs` (below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from drift.models.session import SpanLayers


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
    return _rotary(q, c, s), _rotary(k, c, s), v


def _rotary(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x rotated by cos c and sin s, halves paired (transformers' apply_rotary_pos_emb)."""
    half = x.shape[-1] // 2
    return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s


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
    if config.alibi:  # positions come as attention biases (alibi_bias), not rotary
        return q, k, v
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return _rotary(q, c, s), _rotary(k, c, s), v


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


def scale_of(layer: Any) -> float:
    """The layer's attention scale (Falcon and Bloom name the module self_attention; Bloom
    names the scale inv_norm_factor)."""
    attn = layer.self_attn if hasattr(layer, "self_attn") else layer.self_attention
    return float(attn.scaling if hasattr(attn, "scaling") else attn.inv_norm_factor)


def bloom_attn_inputs(layer: Any, h: torch.Tensor, cos: None,
                      sin: None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """attn_inputs for Bloom: one fused query_key_value product, interleaved per head; no
    rotary (ALiBi biases, alibi_bias)."""
    rows, heads = h.shape[0], layer.self_attention.num_heads
    fused = layer.self_attention.query_key_value(layer.input_layernorm(h))
    q, k, v = fused.view(rows, 1, heads, 3, -1).unbind(-2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def bloom_attn_outputs(layer: Any, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """attn_outputs for Bloom: its attention and MLP add their residual themselves, the normed
    input with apply_residual_connection_post_layernorm, else the input."""
    post_ln = layer.apply_residual_connection_post_layernorm
    dense = layer.self_attention.dense(attn.transpose(1, 2).reshape(h.shape[0], 1, -1))
    r = dense + (layer.input_layernorm(h) if post_ln else h)
    x = layer.post_attention_layernorm(r)
    return layer.mlp(x, x if post_ln else r)


def alibi_bias(span: SpanLayers) -> Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None:
    """For ALiBi spans (Bloom, ALiBi Falcon): a session's [b, n] mask -> its additive attention
    mask [b, heads, 1, n], the family's own biases with padding at the dtype's minimum, as
    transformers adds them (None: the span has no ALiBi)."""
    adapter = span.adapter  # Bloom's config has no `alibi` field: it always uses ALiBi
    if not hasattr(adapter, "alibi_from_mask") or not getattr(span.config, "alibi", True):
        return None
    heads, divisor = int(adapter.num_heads), float(adapter.alibi_divisor())

    def bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        b, n = mask.shape
        biases = adapter.alibi_from_mask(mask, dtype).view(b, heads, 1, n)
        if divisor != 1.0:
            biases = biases / divisor
        return biases.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(dtype).min)

    return bias


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           scale: float, softcap: float | None = None) -> torch.Tensor:  # fmt: skip
    """q [b, Hq, 1, D] over keys/values [b, Hkv, n, D] (mask [b, 1, 1, n] bool, an ALiBi
    span's additive [b, Hq, 1, n] from alibi_bias, or None); with `softcap` (never with ALiBi),
    logits are capped (cap * tanh(logits / cap)) before the softmax, as
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


# DeepSeek-V2/V3 cache each token's latents: `kv_a_layernorm(c)` [b, 1, n, kv_lora_rank] as the
# cache layer's keys and its rotated rope key [b, 1, n, qk_rope_head_dim] as its values.
# transformers expands the whole past through kv_b_proj into per-head keys and values at every
# step (n x kv_lora_rank x heads x (nope + v) multiply-adds per layer). The lean step instead
# absorbs kv_b_proj's key half into the query and its value half into the output (DeepSeek's
# own decode form): each step attends the latents directly, as one key/value head of
# kv_lora_rank + rope dims.
def _kv_b(attn: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight per head: its key half [H, nope, lora] and value half [H, v, lora]."""
    w = attn.kv_b_proj.weight.unflatten(0, (attn.num_heads, -1))  # a view: no copy
    return w[:, : attn.qk_nope_head_dim], w[:, attn.qk_nope_head_dim :]


def _rotate_pairs(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """DeepSeek's interleaved rotary (rope_interleave): pairs (x0, x1), (x2, x3), ... each
    rotated by one frequency, written out de-interleaved, as transformers writes it."""
    half = c.shape[-1] // 2
    c, s = c[..., :half], s[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def mla_attn_inputs(layer: Any, h: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """h [R, 1, H] -> q [R, heads, 1, lora + rope] (its no-rope half absorbed through
    kv_b_proj's key weights), latent [R, 1, 1, lora] and rotated rope key [R, 1, 1, rope]."""
    attn, rows = layer.self_attn, h.shape[0]
    x = layer.input_layernorm(h)
    if attn.q_lora_rank is None:
        q = attn.q_proj(x)
    else:
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
    q = q.view(rows, 1, attn.num_heads, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = q.split([attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    latent, k_rot = attn.kv_a_proj_with_mqa(x).split(
        [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1
    )
    latent = attn.kv_a_layernorm(latent).view(rows, 1, 1, attn.kv_lora_rank)
    k_rot = k_rot.view(rows, 1, 1, attn.qk_rope_head_dim)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [R, 1, 1, rope]
    if attn.config.rope_interleave:
        q_rot, k_rot = _rotate_pairs(q_rot, c, s), _rotate_pairs(k_rot, c, s)
    else:
        q_rot, k_rot = _rotary(q_rot, c, s), _rotary(k_rot, c, s)
    w_key, _ = _kv_b(attn)
    q_latent = torch.matmul(q_pass, w_key)  # [R, heads, 1, nope] @ [heads, nope, lora]
    return torch.cat([q_latent, q_rot], dim=-1), latent, k_rot


def mla_attend(q: torch.Tensor, latents: torch.Tensor, rope_keys: torch.Tensor,
               mask: torch.Tensor | None, scale: float) -> torch.Tensor:  # fmt: skip
    """q [b, heads, 1, lora + rope] over a session's latents [b, 1, n, lora] and rope keys
    [b, 1, n, rope] (mask [b, 1, 1, n] bool or None) -> [b, heads, 1, lora]: the attention
    weights applied to the latents (the value half of kv_b_proj comes after, in `post`)."""
    lora = latents.shape[-1]
    logits = torch.matmul(q[..., :lora], latents.transpose(-1, -2))
    logits = (logits + torch.matmul(q[..., lora:], rope_keys.transpose(-1, -2))) * scale
    if mask is not None:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, latents)


def mla_attn_outputs(layer: Any, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """attn_outputs for MLA: attention over latents [R, heads, 1, lora] through kv_b_proj's
    value half to per-head values [R, heads, 1, v], then o_proj, the MLP (MoE or dense)."""
    _, w_value = _kv_b(layer.self_attn)
    return attn_outputs(layer, h, torch.matmul(attn, w_value.transpose(-1, -2)))


Part = Callable[..., Any]


@dataclass(frozen=True)
class LayerParts:
    """A span's three parts: pre(layer, h, cos, sin) -> q, k, v; attend(q, keys, values, mask,
    scale) -> attention output; post(layer, h, attention output) -> h. With `bias` (ALiBi) the
    mask `attend` gets is bias(session's 2D mask, dtype), and pre gets no rotary (None, None)."""

    pre: Part
    attend: Part
    post: Part
    bias: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None


def parts_of(span: SpanLayers) -> LayerParts:
    """The lean step's parts for the span's layers (all of one family)."""
    kind = type(span.layers[0]).__name__
    if kind == "FalconDecoderLayer":
        return LayerParts(falcon_attn_inputs, attend, falcon_attn_outputs, alibi_bias(span))
    if kind == "BloomBlock":
        return LayerParts(bloom_attn_inputs, attend, bloom_attn_outputs, alibi_bias(span))
    if kind == "DeepseekV3DecoderLayer":
        return LayerParts(mla_attn_inputs, mla_attend, mla_attn_outputs)
    softcap = getattr(span.config, "attn_logit_softcapping", None)
    capped = partial(attend, softcap=float(softcap)) if softcap else attend
    gemma = hasattr(span.layers[0], "pre_feedforward_layernorm")
    return LayerParts(attn_inputs, capped, gemma_attn_outputs if gemma else attn_outputs)
