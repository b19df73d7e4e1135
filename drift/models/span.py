"""ModelSpan: a contiguous slice [start_block, end_block) of a model's blocks, loaded alone.

It loads only its blocks' tensors (built on `meta`, then `load_state_dict(assign=True)`),
runs them statelessly (forward, backward by recomputation) and opens SpanSessions that keep
a KV cache. Family specifics live in the adapter; sessions live in drift.models.session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from drift.models.adapters.base import RunContext
from drift.models.convert import convert_block
from drift.models.inputs import check_hidden, check_mask, check_prompts, check_range
from drift.models.memory import trim_heap
from drift.models.quant import QUANT_TYPES, quant_backend, quantize_layer
from drift.models.registry import get_adapter
from drift.wire.errors import BadRequest, BadTensor

if TYPE_CHECKING:
    from drift.models.session import SpanSession


def positions_from_mask(mask_2d: torch.Tensor, tokens: int) -> torch.Tensor:
    """[B, T] positions of the last `tokens` columns: count of real tokens before each one."""
    positions = mask_2d.long().cumsum(-1) - 1  # [B, S]
    positions = positions.masked_fill(~mask_2d, 1)
    return positions[:, -tokens:]


def add_prompts(hidden: torch.Tensor, prompt: torch.Tensor, offset: int) -> torch.Tensor:
    """Add prompt [B, P, H] to the tokens of hidden [B, T, H] that sit at positions < P."""
    tokens, length = hidden.shape[1], prompt.shape[1]
    end = min(length, offset + tokens)
    if end <= offset:
        return hidden
    head = hidden[:, : end - offset] + prompt[:, offset:end].to(hidden.dtype)
    return torch.cat([head, hidden[:, end - offset :]], dim=1)


class ModelSpan(torch.nn.Module):
    """The model's own decoder layers for blocks [start_block, end_block), absolute indices."""

    def __init__(
        self,
        adapter: Any,
        layers: list[torch.nn.Module],
        start_block: int,
        end_block: int,
        dtype: torch.dtype,
        device: torch.device,
        quant: str = "none",
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.config = adapter.config
        self.start_block, self.end_block = start_block, end_block
        self.dtype, self.device = dtype, device
        self.quant = quant  # none | int8 | nf4: how the blocks' linear weights are stored
        self.layers = torch.nn.ModuleList(layers)
        self.aux = adapter.build_aux().to(device)

    @classmethod
    def load(
        cls,
        ckpt: Any,
        start_block: int,
        end_block: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        quant: str = "none",
        progress: Callable[[int, int], None] | None = None,
    ) -> ModelSpan:
        """Load blocks [start_block, end_block) alone; `progress(done, total)` after each.

        `quant` int8/nf4 stores the blocks' linear weights quantized (drift.models.quant),
        one block at a time, so the float weights of only one block exist at once.
        """
        adapter = get_adapter(ckpt.config)
        if not 0 <= start_block < end_block <= adapter.num_layers:
            raise BadRequest(
                f"span [{start_block}, {end_block}) is outside the model's "
                f"{adapter.num_layers} blocks [0, {adapter.num_layers})"
            )
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise BadRequest(f"unsupported dtype {dtype}; use float32, float16 or bfloat16")
        if quant not in QUANT_TYPES:
            raise BadRequest(f"unknown quantization {quant!r}; use one of {', '.join(QUANT_TYPES)}")
        if quant != "none":
            quant_backend()  # a missing bitsandbytes fails before any weight is read
        device = torch.device(device)
        # A partial (Hub) checkpoint fetches this span's shards in one go, and no others.
        ckpt.prefetch([adapter.layer_prefix.format(i=i) for i in range(start_block, end_block)])
        layers = []
        for i in range(start_block, end_block):
            layers.append(_load_layer(adapter, ckpt, i, dtype, device, quant))
            if progress is not None:
                progress(len(layers), end_block - start_block)
        trim_heap()  # the float copies freed while loading (and quantizing) go back to the OS
        return cls(adapter, layers, start_block, end_block, dtype, device, quant)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.layers.parameters())

    # --- core ------------------------------------------------------------------------------
    def run_layers(
        self,
        layer_ids: tuple[int, ...],
        hidden: torch.Tensor,
        mask_2d: torch.Tensor,
        cache: Any,
        prompts: torch.Tensor | None,
        offset: int,
    ) -> torch.Tensor:
        """hidden [B, T, H] (span dtype) through `layer_ids`; mask_2d [B, past + T] bool."""
        positions = positions_from_mask(mask_2d, hidden.shape[1])
        ctx = RunContext(layer_ids, mask_2d, positions, cache)
        prep = self.adapter.prepare(self.aux, hidden, ctx)
        for j, index in enumerate(layer_ids):
            if prompts is not None:
                hidden = add_prompts(hidden, prompts[j], offset)
            layer = self.layers[index - self.start_block]
            hidden = self.adapter.call_layer(layer, index, hidden, prep, ctx)
        return hidden

    def _prepare_inputs(
        self,
        hidden: torch.Tensor,
        start_block: int | None,
        end_block: int | None,
        attention_mask: torch.Tensor | None,
        prompts: torch.Tensor | None,
    ) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor]:
        start, end = check_range(start_block, end_block, self.start_block, self.end_block)
        check_hidden(hidden, self.adapter.hidden_size)
        batch, tokens = hidden.shape[:2]
        mask = check_mask(attention_mask, batch, tokens)
        check_prompts(prompts, end - start, batch, self.adapter.hidden_size)
        if mask is None:
            mask = torch.ones(batch, tokens, dtype=torch.bool)
        return tuple(range(start, end)), mask.to(self.device), hidden.to(self.device, self.dtype)

    def forward(
        self,
        hidden: torch.Tensor,
        *,
        start_block: int | None = None,
        end_block: int | None = None,
        attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Stateless pass of hidden [B, T, H]; returns [B, T, H] in hidden's dtype."""
        ids, mask, inputs = self._prepare_inputs(
            hidden, start_block, end_block, attention_mask, prompts
        )
        if prompts is not None:
            prompts = prompts.to(self.device, self.dtype)
        with torch.no_grad():
            out = self.run_layers(ids, inputs, mask, None, prompts, 0)
        return out.to(hidden.dtype)

    def backward(
        self,
        hidden: torch.Tensor,
        grad_output: torch.Tensor,
        *,
        start_block: int | None = None,
        end_block: int | None = None,
        attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gradients w.r.t. hidden (and prompts), by recomputing the forward with autograd."""
        ids, mask, inputs = self._prepare_inputs(
            hidden, start_block, end_block, attention_mask, prompts
        )
        check_hidden(grad_output, self.adapter.hidden_size, name="grad_outputs")
        if grad_output.shape != hidden.shape:
            raise BadTensor(
                f"grad_outputs shape {tuple(grad_output.shape)} differs from hidden_states "
                f"{tuple(hidden.shape)}"
            )
        with torch.enable_grad():
            inputs = inputs.detach().requires_grad_(True)
            wanted = [inputs]
            span_prompts = None
            if prompts is not None:
                span_prompts = prompts.detach().to(self.device, self.dtype).requires_grad_(True)
                wanted.append(span_prompts)
            out = self.run_layers(ids, inputs, mask, None, span_prompts, 0)
            grads = torch.autograd.grad(
                out, wanted, grad_output.to(self.device, out.dtype), allow_unused=True
            )
        grad_hidden = grads[0].to(hidden.dtype)
        if prompts is None:
            return grad_hidden, None
        grad_prompts = grads[1] if grads[1] is not None else torch.zeros_like(span_prompts)
        return grad_hidden, grad_prompts.to(prompts.dtype)

    def new_session(
        self,
        *,
        batch_size: int,
        max_length: int,
        start_block: int | None = None,
        end_block: int | None = None,
    ) -> SpanSession:
        from drift.models.session import SpanSession

        start, end = check_range(start_block, end_block, self.start_block, self.end_block)
        return SpanSession(self, start, end, batch_size=batch_size, max_length=max_length)


def _load_layer(
    adapter: Any, ckpt: Any, index: int, dtype: torch.dtype, device: torch.device, quant: str
) -> torch.nn.Module:
    """Block `index` built on meta, then given the checkpoint's tensors (nothing else read)."""
    prefix = adapter.layer_prefix.format(i=index)
    stored = ckpt.tensors(prefix)
    if not stored:
        raise BadRequest(f"the checkpoint has no tensors for block {index} (prefix {prefix!r})")
    # Quantized blocks are assembled on the CPU; bitsandbytes quantizes on the move to `device`.
    # copy=True: a tensor read in its stored dtype is a view of the safetensors file's mmap, and
    # one such view (a norm) would keep the whole mapping, and every page of it read, resident.
    target = device if quant == "none" else torch.device("cpu")
    state = {
        name: t.to(target, dtype if t.is_floating_point() else t.dtype, copy=True)
        for name, t in convert_block(adapter.config.model_type, prefix, stored).items()
    }
    layer = adapter.build_layer(index)
    try:
        layer.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise BadRequest(f"block {index} does not match the checkpoint: {exc}") from exc
    leftover = [n for n, b in layer.named_buffers() if b.is_meta]
    if leftover:
        raise BadRequest(f"block {index} has buffers the checkpoint does not hold: {leftover}")
    layer.requires_grad_(False)
    if quant != "none":
        layer = quantize_layer(layer, quant, dtype, device)
    return layer.eval()
