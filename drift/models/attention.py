"""Attention of a prompt chunk that follows a past, on the CPU, without a materialised mask.

A long prompt reaches a server's session in chunks (the client's pipelined pieces, the
server's units of work): each chunk of T tokens after P cached ones attends all P past keys
and, causally, its own T. transformers builds that as a [T, P + T] boolean mask, which the
CPU SDPA kernel reads in full (converted to an additive float mask per layer) and computes
every block of, the masked ones too. Here the two parts run apart (the past unmasked, the
chunk with `is_causal`) and merge by their log-sum-exps: the same numbers (to rounding),
no mask, no work on masked blocks. SmolLM2's 4,096-token prefill in 512-token chunks spent
2.9 s in attention against 2.5 s in one piece.

The llama-like adapters run attention as DRIFT_SDPA: transformers' SDPA path for every mask
but `AfterPast`, the sentinel their `prepare` passes for a chunk after a past with no
padding. Anything this path does not take (another device, gradients, value heads of
another size than the queries': DeepSeek-V3's latent attention) gets the mask materialised
and transformers' own path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

DRIFT_SDPA = "drift_sdpa"


@dataclass(frozen=True)
class AfterPast:
    """The mask of `tokens` new tokens after `past` cached ones, no padding anywhere: each
    attends every past token and the new ones up to itself."""

    past: int
    tokens: int

    def materialize(self, device: torch.device) -> torch.Tensor:
        """The [1, 1, tokens, past + tokens] boolean mask transformers would have built."""
        ones = torch.ones(self.tokens, self.past + self.tokens, dtype=torch.bool, device=device)
        return ones.tril(self.past)[None, None]


def chunk_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past: int,
                    scale: float) -> torch.Tensor:  # fmt: skip
    """query [B, Hq, T, D]; key, value [B, Hkv, past + T, D] (Hq a multiple of Hkv, each
    key/value head serving Hq / Hkv consecutive query heads, as transformers' repeat_kv).
    Returns [B, Hq, T, D]."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    group = hq // hkv
    # the past: unmasked, so a group's query heads stack along the sequence axis and share
    # their one key/value head (no copy of the past per query head)
    out_past, lse_past = flash(query.reshape(b, hkv, group * t, d), key[:, :, :past],
                               value[:, :, :past], 0.0, False, scale=scale)  # fmt: skip
    out_past, lse_past = out_past.reshape(b, hq, t, d), lse_past.reshape(b, hq, t)
    new_k, new_v = key[:, :, past:], value[:, :, past:]
    if group > 1:  # the chunk's own T keys: small, copied per query head
        new_k, new_v = new_k.repeat_interleave(group, 1), new_v.repeat_interleave(group, 1)
    out_new, lse_new = flash(query, new_k, new_v, 0.0, True, scale=scale)
    lse = torch.logaddexp(lse_past, lse_new)
    return (out_past * torch.exp(lse_past - lse)[..., None]
            + out_new * torch.exp(lse_new - lse)[..., None]).to(query.dtype)  # fmt: skip


def _takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float,
           mask: AfterPast) -> bool:  # fmt: skip
    return (query.device.type == "cpu" and dropout == 0.0 and not torch.is_grad_enabled()
            and value.shape[-1] == query.shape[-1] and query.shape[1] % key.shape[1] == 0
            and key.shape[2] == mask.past + mask.tokens == value.shape[2]
            and query.shape[2] == mask.tokens and query.dtype in (torch.float32, torch.bfloat16))  # fmt: skip


def drift_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attention_mask: Any, dropout: float = 0.0,
               scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention-function signature; returns ([B, T, Hq, D], None)."""
    if isinstance(attention_mask, AfterPast):
        if _takes(query, key, value, dropout, attention_mask):
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            out = chunk_attention(query, key, value, attention_mask.past, scale)
            return out.transpose(1, 2).contiguous(), None
        attention_mask = attention_mask.materialize(query.device)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)  # fmt: skip


# transformers' registries of attention and mask functions, by implementation name: masks
# are SDPA's, so every mask but AfterPast is what the "sdpa" implementation would see
AttentionInterface.register(DRIFT_SDPA, drift_sdpa)
AttentionMaskInterface.register(DRIFT_SDPA, sdpa_mask)
