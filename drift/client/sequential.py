"""RemoteSequential: the model's remote blocks as one nn.Module, sliceable like a list.

`layers[3:7](hidden)` runs blocks 3..6 on whichever servers hold them; gradients flow back
through POST /backward by an autograd Function (to the inputs, deep prompts, Gemma 4's
per-layer inputs and the LoRA weights of `lora` (drift.client.lora), sent with every
request; the keys/values Gemma 4 shares between hops stay inside the chain).
Tensors on any device go to the wire from the CPU and come back to where they came from.
As in Petals, `RemoteSequential(config)` (AutoDistributedConfig) builds its own client.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from drift.client.distributed_config import client_for
from drift.client.extras import check_chain
from drift.client.lora import ClientLora
from drift.client.remote import RemoteClient
from drift.client.session import InferenceSession


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().to("cpu")


def _back(tensor: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None or like is None else tensor.to(like.device, like.dtype)


class _RemoteChain(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, prompts: torch.Tensor | None,
        per_layer: torch.Tensor | None, seq: RemoteSequential,
        attention_mask: torch.Tensor | None, states: bool, lora_names: tuple[str, ...],
        *lora: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        client = seq.client
        wire = (_cpu(prompts), _cpu(per_layer), _cpu(attention_mask))
        out, trace = client.run(
            client.forward(hidden.detach().to("cpu"), seq.start_block, seq.end_block,
                           attention_mask=wire[2], prompts=wire[0], per_layer=wire[1],
                           states=states,
                           lora={n: t.detach().to("cpu")
                                 for n, t in zip(lora_names, lora, strict=True)})
        )  # fmt: skip
        ctx.seq, ctx.trace, ctx.wire, ctx.inputs = seq, trace, wire, (hidden, prompts, per_layer)
        ctx.lora = (lora_names, lora)
        block_states = (
            torch.cat([t.states for t in trace if t.states is not None], dim=2)  # [B, T, n, H]
            if states
            else hidden.new_empty(0)
        )
        ctx.mark_non_differentiable(block_states)
        return out.to(hidden.device, hidden.dtype), block_states.to(hidden.device, hidden.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[Any, ...]:  # type: ignore[override]
        seq: RemoteSequential = ctx.seq
        prompts, per_layer, mask = ctx.wire
        grad_in, grad_prompts, grad_per_layer, named = seq.client.run(
            seq.client.backward(ctx.trace, grad.to("cpu").contiguous(), seq.start_block,
                                attention_mask=mask, prompts=prompts, per_layer=per_layer)
        )  # fmt: skip
        hidden, prompts_in, per_layer_in = ctx.inputs
        lora_names, lora = ctx.lora
        return (_back(grad_in, hidden), _back(grad_prompts, prompts_in),
                _back(grad_per_layer, per_layer_in), None, None, None, None,
                *(_back(named.get(n), t)
                  for n, t in zip(lora_names, lora, strict=True)))  # fmt: skip


class RemoteSequential(nn.Module):
    """Blocks [start_block, end_block) of a model served by the swarm."""

    def __init__(
        self, client: RemoteClient | PretrainedConfig, start_block: int = 0,
        end_block: int | None = None, lora: ClientLora | None = None,
    ) -> None:  # fmt: skip
        """`client`: a model's, or a config from AutoDistributedConfig (then `end_block`
        defaults to the model's number of blocks); `lora`: LoRA weights trained through the
        blocks (a slice shares its model's)."""
        super().__init__()
        if isinstance(client, PretrainedConfig):
            end_block = client.num_hidden_layers if end_block is None else end_block
            client = client_for(client)
        if end_block is None:
            raise ValueError("give end_block: the blocks are [start_block, end_block)")
        if not 0 <= start_block < end_block:
            raise ValueError(f"empty or negative span [{start_block}, {end_block})")
        self.client = client
        self.start_block, self.end_block = start_block, end_block
        self.lora = lora

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None, per_layer_inputs: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """[B, T, H] -> [B, T, H]; prompts [n_blocks, B, P, H] are deep prompts;
        per_layer_inputs [B, T, n_blocks, P] Gemma 4's (ClientHead.per_layer_inputs)."""
        return self._chain(hidden, attention_mask, prompts, per_layer_inputs, False)[0]

    def forward_with_states(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None, per_layer_inputs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """`forward`, also giving each block's output [B, T, n_blocks, H] (no gradient flows
        through those; the servers send them only when asked)."""
        return self._chain(hidden, attention_mask, prompts, per_layer_inputs, True)

    def _chain(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
        prompts: torch.Tensor | None, per_layer_inputs: torch.Tensor | None, states: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
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
        lora = self.lora.wire(self.start_block, self.end_block) if self.lora is not None else {}
        return _RemoteChain.apply(hidden, prompts, per_layer_inputs, self, attention_mask, states,
                                  tuple(lora), *lora.values())  # fmt: skip

    def __len__(self) -> int:
        return self.end_block - self.start_block

    def __getitem__(self, index: int | slice) -> RemoteSequential:
        n = len(self)
        if isinstance(index, int):
            if not -n <= index < n:
                raise IndexError(f"block {index} out of range for {n} blocks")
            index %= n
            return RemoteSequential(self.client, self.start_block + index,
                                    self.start_block + index + 1, self.lora)  # fmt: skip
        start, stop, step = index.indices(n)
        if step != 1:
            raise ValueError("RemoteSequential slices must be contiguous (step 1)")
        if stop <= start:
            raise IndexError(f"empty slice {index} of {n} blocks")
        return RemoteSequential(self.client, self.start_block + start, self.start_block + stop,
                                self.lora)  # fmt: skip

    def __iter__(self):  # type: ignore[override]
        return (self[i] for i in range(len(self)))

    def inference_session(
        self, *, max_length: int, batch_size: int = 1, dtype: torch.dtype = torch.float32,
        active_adapter: str | None = None,
    ) -> InferenceSession:  # fmt: skip
        """A session over these blocks, with the model's trained LoRA weights (sent once)
        and the served adapter `active_adapter` (default: the client's)."""
        check_chain(self.client.sharing, self.start_block, self.end_block)
        wire = {} if self.lora is None else self.lora.wire(self.start_block, self.end_block)
        lora = {k: v.detach().to("cpu") for k, v in wire.items()}
        adapter = active_adapter if active_adapter is not None else self.client.adapter
        return InferenceSession(self.client, self.start_block, self.end_block,
                                max_length=max_length, batch_size=batch_size, dtype=dtype,
                                adapter=adapter, lora=lora)  # fmt: skip

    def extra_repr(self) -> str:
        return f"blocks [{self.start_block}, {self.end_block})"
