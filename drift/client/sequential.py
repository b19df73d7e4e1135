"""RemoteSequential: the model's remote blocks as one nn.Module, sliceable like a list.

`layers[3:7](hidden)` runs blocks 3..6 on whichever servers hold them; gradients flow back
through POST /backward by an autograd Function (to the inputs, deep prompts and Gemma 4's
per-layer inputs; the keys/values Gemma 4 shares between hops stay inside the chain).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from drift.client.extras import check_chain
from drift.client.remote import RemoteClient
from drift.client.session import InferenceSession


class _RemoteChain(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, prompts: torch.Tensor | None,
        per_layer: torch.Tensor | None, seq: RemoteSequential,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        client = seq.client
        prompts = None if prompts is None else prompts.detach()
        per_layer = None if per_layer is None else per_layer.detach()
        out, trace = client.run(
            client.forward(hidden.detach(), seq.start_block, seq.end_block,
                           attention_mask=attention_mask, prompts=prompts, per_layer=per_layer)
        )  # fmt: skip
        ctx.seq, ctx.trace, ctx.mask = seq, trace, attention_mask
        ctx.prompts, ctx.per_layer = prompts, per_layer
        return out.to(hidden.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        seq: RemoteSequential = ctx.seq
        grad_in, grad_prompts, grad_per_layer, _ = seq.client.run(
            seq.client.backward(ctx.trace, grad.contiguous(), seq.start_block,
                                attention_mask=ctx.mask, prompts=ctx.prompts,
                                per_layer=ctx.per_layer)
        )  # fmt: skip
        return grad_in.to(grad.dtype), grad_prompts, grad_per_layer, None, None


class RemoteSequential(nn.Module):
    """Blocks [start_block, end_block) of a model served by the swarm."""

    def __init__(self, client: RemoteClient, start_block: int, end_block: int) -> None:
        super().__init__()
        if not 0 <= start_block < end_block:
            raise ValueError(f"empty or negative span [{start_block}, {end_block})")
        self.client = client
        self.start_block, self.end_block = start_block, end_block

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None, per_layer_inputs: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """[B, T, H] -> [B, T, H]; prompts [n_blocks, B, P, H] are deep prompts;
        per_layer_inputs [B, T, n_blocks, P] Gemma 4's (ClientHead.per_layer_inputs)."""
        if hidden.dim() != 3:
            raise ValueError(f"hidden states must be [batch, tokens, hidden], got {hidden.shape}")
        if prompts is not None and prompts.shape[0] != len(self):
            raise ValueError(f"prompts cover {prompts.shape[0]} blocks, the span has {len(self)}")
        if per_layer_inputs is not None and (
            per_layer_inputs.dim() != 4 or per_layer_inputs.shape[2] != len(self)
        ):
            raise ValueError(
                f"per_layer_inputs must be [batch, tokens, {len(self)} blocks, width], "
                f"got {list(per_layer_inputs.shape)}"
            )
        check_chain(self.client.sharing, self.start_block, self.end_block)
        return _RemoteChain.apply(hidden, prompts, per_layer_inputs, self, attention_mask)

    def __len__(self) -> int:
        return self.end_block - self.start_block

    def __getitem__(self, index: int | slice) -> RemoteSequential:
        n = len(self)
        if isinstance(index, int):
            if not -n <= index < n:
                raise IndexError(f"block {index} out of range for {n} blocks")
            index %= n
            return RemoteSequential(self.client, self.start_block + index,
                                    self.start_block + index + 1)  # fmt: skip
        start, stop, step = index.indices(n)
        if step != 1:
            raise ValueError("RemoteSequential slices must be contiguous (step 1)")
        if stop <= start:
            raise IndexError(f"empty slice {index} of {n} blocks")
        return RemoteSequential(self.client, self.start_block + start, self.start_block + stop)

    def __iter__(self):  # type: ignore[override]
        return (self[i] for i in range(len(self)))

    def inference_session(
        self, *, max_length: int, batch_size: int = 1, dtype: torch.dtype = torch.float32
    ) -> InferenceSession:
        check_chain(self.client.sharing, self.start_block, self.end_block)
        return InferenceSession(self.client, self.start_block, self.end_block,
                                max_length=max_length, batch_size=batch_size, dtype=dtype)  # fmt: skip

    def extra_repr(self) -> str:
        return f"blocks [{self.start_block}, {self.end_block})"
