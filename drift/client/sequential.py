"""RemoteSequential: the model's remote blocks as one nn.Module, sliceable like a list.

`layers[3:7](hidden)` runs blocks 3..6 on whichever servers hold them; gradients flow back
through POST /backward by an autograd Function (to the inputs, deep prompts, Gemma 4's
per-layer inputs and the LoRA weights of `lora` (drift.client.lora), sent with every
request; the keys/values Gemma 4 shares between hops stay inside the chain). A big batch
goes as groups of rows (`forward_chunk_bytes`), each its own chain, all at once.
Tensors on any device go to the wire from the CPU and come back to where they came from.
As in Petals, `RemoteSequential(config)` (AutoDistributedConfig) builds its own client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from drift.client.chain import MakeRoom
from drift.client.distributed_config import client_for
from drift.client.extras import check_chain
from drift.client.lora import ClientLora
from drift.client.remote import RemoteClient
from drift.client.session import InferenceSession


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().to("cpu")


def _back(tensor: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None or like is None else tensor.to(like.device, like.dtype)


def row_groups(shape: torch.Size, chunk_bytes: int) -> list[slice]:
    """Consecutive rows of a [B, T, H] float32 batch, each group's hidden states at most
    `chunk_bytes` (at least one row; 0: one group)."""
    batch, per_row = shape[0], int(shape[1]) * int(shape[2]) * 4
    rows = batch if chunk_bytes <= 0 else max(1, chunk_bytes // max(per_row, 1))
    return [slice(a, min(batch, a + rows)) for a in range(0, batch, rows)]


def _rows(tensor: torch.Tensor | None, rows: slice, dim: int = 0) -> torch.Tensor | None:
    """`tensor`'s rows `rows` along `dim`; a tensor shared by every row (size 1) as is."""
    if tensor is None or tensor.shape[dim] == 1:
        return tensor
    return tensor.narrow(dim, rows.start, rows.stop - rows.start)


class _RemoteChain(torch.autograd.Function):
    """Rows in groups of at most `ClientConfig.forward_chunk_bytes` of hidden states, each
    its own chain of /forward (and /backward) requests, all at once: a group is on server 2
    while the next is on server 1, and no body outgrows a server's limit."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, prompts: torch.Tensor | None,
        per_layer: torch.Tensor | None, seq: RemoteSequential,
        attention_mask: torch.Tensor | None, states: bool, lora_names: tuple[str, ...],
        *lora: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        client = seq.client
        wire = (_cpu(prompts), _cpu(per_layer), _cpu(attention_mask))
        cpu = hidden.detach().to("cpu")
        groups = row_groups(cpu.shape, client.config.forward_chunk_bytes)
        weights = {n: t.detach().to("cpu") for n, t in zip(lora_names, lora, strict=True)}

        async def run_all() -> list[Any]:
            return await asyncio.gather(*(
                client.forward(cpu[g], seq.start_block, seq.end_block,
                               attention_mask=_rows(wire[2], g), prompts=_rows(wire[0], g, 1),
                               per_layer=_rows(wire[1], g), states=states, lora=weights)
                for g in groups
            ))  # fmt: skip

        results = client.run(run_all())
        ctx.seq, ctx.groups, ctx.wire = seq, groups, wire
        ctx.traces = [trace for _, trace in results]
        ctx.inputs = (hidden, prompts, per_layer)
        ctx.lora = (lora_names, lora)
        out = torch.cat([o for o, _ in results], dim=0)
        block_states = (
            torch.cat([torch.cat([t.states for t in trace if t.states is not None], dim=2)
                       for trace in ctx.traces], dim=0)  # [B, T, n, H]
            if states
            else hidden.new_empty(0)
        )  # fmt: skip
        ctx.mark_non_differentiable(block_states)
        return out.to(hidden.device, hidden.dtype), block_states.to(hidden.device, hidden.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: Any) -> tuple[Any, ...]:  # type: ignore[override]
        seq: RemoteSequential = ctx.seq
        client = seq.client
        prompts, per_layer, mask = ctx.wire
        grad = grad.to("cpu").contiguous()

        async def run_all() -> list[Any]:
            return await asyncio.gather(*(
                client.backward(trace, grad[g], seq.start_block, attention_mask=_rows(mask, g),
                                prompts=_rows(prompts, g, 1), per_layer=_rows(per_layer, g))
                for g, trace in zip(ctx.groups, ctx.traces, strict=True)
            ))  # fmt: skip

        results = client.run(run_all())
        grad_in = torch.cat([r[0] for r in results], dim=0)
        grad_prompts = _merge([r[1] for r in results], prompts, dim=1)
        grad_per_layer = _merge([r[2] for r in results], per_layer, dim=0)
        lora_names, lora = ctx.lora
        named: dict[str, torch.Tensor] = {}  # LoRA weights' gradients: every row shares them
        for name in lora_names:
            parts = [r[3][name] for r in results if name in r[3]]
            if parts:
                named[name] = torch.stack(parts).sum(dim=0)
        hidden, prompts_in, per_layer_in = ctx.inputs
        return (_back(grad_in, hidden), _back(grad_prompts, prompts_in),
                _back(grad_per_layer, per_layer_in), None, None, None, None,
                *(_back(named.get(n), t)
                  for n, t in zip(lora_names, lora, strict=True)))  # fmt: skip


def _merge(parts: list[torch.Tensor | None], given: torch.Tensor | None,
           dim: int) -> torch.Tensor | None:  # fmt: skip
    """Row groups' gradients w.r.t. an input: concatenated along its rows, or summed when
    every row shared it (size 1 there)."""
    if given is None or any(p is None for p in parts):
        return None
    tensors = [p for p in parts if p is not None]
    if len(tensors) == 1:
        return tensors[0]
    if given.shape[dim] == 1:
        return torch.stack(tensors).sum(dim=0)
    return torch.cat(tensors, dim=dim)


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
        active_adapter: str | None = None, headroom: int = 0, make_room: MakeRoom | None = None,
    ) -> InferenceSession:  # fmt: skip
        """A session over these blocks, with the model's trained LoRA weights (sent once)
        and the served adapter `active_adapter` (default: the client's); `headroom`,
        `make_room`: InferenceSession's."""
        check_chain(self.client.sharing, self.start_block, self.end_block)
        wire = {} if self.lora is None else self.lora.wire(self.start_block, self.end_block)
        lora = {k: v.detach().to("cpu") for k, v in wire.items()}
        adapter = active_adapter if active_adapter is not None else self.client.adapter
        return InferenceSession(self.client, self.start_block, self.end_block,
                                max_length=max_length, batch_size=batch_size, dtype=dtype,
                                adapter=adapter, lora=lora, headroom=headroom,
                                make_room=make_room)  # fmt: skip

    def extra_repr(self) -> str:
        return f"blocks [{self.start_block}, {self.end_block})"
