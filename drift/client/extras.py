"""What one hop of a chain sends beside hidden states, and asks back (Gemma 4).

A chain over [start, end) slices the per-layer inputs for each hop, hands every hop the
keys/values its blocks read from donors of earlier hops (kept by name as they come back),
and asks each hop for the donors' keys/values that later hops up to `stop` read. Pure: no
I/O; every other family sends and asks nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from drift.models.sharing import KVSharing
from drift.wire.extras import PER_LAYER_INPUTS, kv_names

Tensors = dict[str, torch.Tensor]


def hop_extras(
    sharing: KVSharing, start: int, hop_start: int, hop_end: int,
    per_layer: torch.Tensor | None, shared: Mapping[str, torch.Tensor],
) -> Tensors:  # fmt: skip
    """The named tensors blocks [hop_start, hop_end) take: their slice of `per_layer` [B, T,
    n, P] (over blocks from `start`) and the keys/values they read from earlier donors."""
    out: Tensors = {}
    if per_layer is not None:
        out[PER_LAYER_INPUTS] = per_layer[:, :, hop_start - start : hop_end - start]
    for donor in sharing.consumed(hop_start, hop_end):
        for name in kv_names(donor):
            if name not in shared:
                raise ValueError(
                    f"blocks [{hop_start}, {hop_end}) read the keys/values of block {donor}, "
                    "which this call does not run: start the blocks at or before it"
                )
            out[name] = shared[name]
    return out


def check_chain(sharing: KVSharing, start: int, end: int) -> None:
    """A chain must run the donors its consumers read (a slice may not cut them off)."""
    hop_extras(sharing, start, start, end, None, {})


def add_grads(into: Tensors, grads: Mapping[str, torch.Tensor]) -> None:
    """Sum gradients w.r.t. shared keys/values that several hops read."""
    for name, grad in grads.items():
        into[name] = into[name] + grad if name in into else grad
