"""ModelSpan: a contiguous slice [start_block, end_block) of a model's blocks, loaded alone.

It loads only its blocks' tensors (built on `meta`, then `load_state_dict(assign=True)`),
runs them statelessly (forward, backward by recomputation) and opens SpanSessions that keep
a KV cache. Family specifics live in the adapter; sessions live in drift.models.session.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from drift.models.adapters.base import RunContext
from drift.models.convert import convert_block
from drift.models.lora import LoraHooks, lora_targets
from drift.models.memory import trim_heap
from drift.models.quant import QUANT_TYPES, quant_backend, quantize_layer
from drift.models.registry import get_adapter
from drift.models.session import SpanSession
from drift.wire.checks import check_grad_outputs, check_lora, check_pass
from drift.wire.errors import BadRequest, SpanNotServed, UnknownAdapter
from drift.wire.extras import BLOCK_STATES, ExtraSpec, kv_block
from drift.wire.lora import split_lora

Tensors = dict[str, torch.Tensor]


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
        # LoRA: the modules weights may adapt, the hooks adding them, served adapters by name
        self.lora_targets = tuple(t for i, layer in enumerate(layers)
                                  for t in lora_targets(layer, start_block + i))  # fmt: skip
        self.lora = LoraHooks(self.layers, start_block, device, dtype)
        self.adapters: dict[str, Tensors] = {}

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
        ckpt.prefetch([ckpt.layout.stored(adapter.layer_prefix.format(i=i))
                       for i in range(start_block, end_block)])  # fmt: skip
        layers = []
        for i in range(start_block, end_block):
            layers.append(_load_layer(adapter, ckpt, i, dtype, device, quant))
            if progress is not None:
                progress(len(layers), end_block - start_block)
        trim_heap()  # the float copies freed while loading (and quantizing) go back to the OS
        return cls(adapter, layers, start_block, end_block, dtype, device, quant)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.layers.parameters())

    def unload(self) -> None:
        """Drop every weight, buffer and served adapter (their memory goes back): this span
        can no longer compute. What makes room for another span on a full machine."""
        for module in self.modules():
            module._parameters.clear()  # quantized parameters take their quant state along
            module._buffers.clear()
        self.adapters.clear()
        trim_heap()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # back from torch's caching allocator to the device

    def add_adapter(self, name: str, weights: Mapping[str, torch.Tensor]) -> None:
        """Serve LoRA weights (wire-named, B scaled; drift.models.peft_files) as `name`."""
        checked = check_lora(weights, self.lora_targets)
        self.adapters[name] = {k: v.to(self.device, self.dtype) for k, v in checked.items()}

    @contextlib.contextmanager
    def serving(self, *weights: Mapping[str, torch.Tensor],
                adapter: str | None = None) -> Iterator[None]:  # fmt: skip
        """Every call inside adds the served adapter `adapter` and LoRA `weights` (a
        session's) to its blocks' outputs."""
        if adapter is not None and adapter not in self.adapters:
            raise UnknownAdapter(f"this server holds no adapter {adapter!r}; it holds "
                                 f"{sorted(self.adapters)}")  # fmt: skip
        served = self.adapters[adapter] if adapter is not None else {}
        with self.lora.fixed(served, *weights):
            yield

    # --- core ------------------------------------------------------------------------------
    def run_layers(
        self,
        layer_ids: tuple[int, ...],
        hidden: torch.Tensor,
        mask_2d: torch.Tensor,
        cache: Any,
        prompts: torch.Tensor | None,
        offset: int,
        extras: Mapping[str, torch.Tensor] | None = None,
        donate: tuple[int, ...] = (),
        states: bool = False,
    ) -> tuple[torch.Tensor, Tensors]:
        """hidden [B, T, H] (span dtype) through `layer_ids`; mask_2d [B, past + T] bool.
        Returns the output and the shared K/V of the `donate` blocks (Gemma 4), by name, with
        each layer's output as BLOCK_STATES [B, T, n, H] when `states` is asked."""
        tokens = hidden.shape[1]
        positions = positions_from_mask(mask_2d, tokens)
        lora, extras = split_lora(extras or {})
        ctx = RunContext(layer_ids, mask_2d, positions, cache, extras)
        prep = self.adapter.prepare(self.aux, hidden, ctx)
        outputs = []
        with self.lora.use(lora):
            for j, index in enumerate(layer_ids):
                if prompts is not None:
                    hidden = add_prompts(hidden, prompts[j], offset)
                layer = self.layers[index - self.start_block]
                hidden = self.adapter.call_layer(layer, index, hidden, prep, ctx)
                if states:
                    outputs.append(hidden)
        named = self.adapter.donated(prep, ctx, donate, tokens)
        if states:
            named[BLOCK_STATES] = torch.stack(outputs, dim=2)  # [B, T, n, H]
        return hidden, named

    def extra_spec(self, start_block: int, end_block: int) -> ExtraSpec:
        """The named tensors blocks [start_block, end_block) take and give (drift.wire.extras),
        and the modules LoRA weights may adapt there."""
        lora = tuple(t for t in self.lora_targets if start_block <= t.block < end_block)
        return dataclasses.replace(self.adapter.extra_spec(start_block, end_block), lora=lora)

    def check_range(self, start_block: int | None, end_block: int | None) -> tuple[int, int]:
        """The half-open sub-span [start, end) of what is held, defaults filled in."""
        start = self.start_block if start_block is None else int(start_block)
        end = self.end_block if end_block is None else int(end_block)
        if not self.start_block <= start < end <= self.end_block:
            raise SpanNotServed(f"blocks [{start}, {end}) are not inside the served span "
                                f"[{self.start_block}, {self.end_block})")  # fmt: skip
        return start, end

    def forward(
        self,
        hidden: torch.Tensor,
        *,
        start_block: int | None = None,
        end_block: int | None = None,
        attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None,
        extras: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Stateless pass of hidden [B, T, H]; returns [B, T, H] in hidden's dtype. `extras`:
        the named tensors the sub-span takes (extra_spec: Gemma 4's per-layer inputs, K/V)."""
        start, end = self.check_range(start_block, end_block)
        x = check_pass(hidden, attention_mask, prompts, hidden_size=self.adapter.hidden_size,
                       n_blocks=end - start, extras=extras,
                       spec=self.extra_spec(start, end))  # fmt: skip
        return self.run_forward(start, end, x.hidden, x.attention_mask, x.prompts, x.extras)[0]

    def backward(
        self,
        hidden: torch.Tensor,
        grad_output: torch.Tensor,
        *,
        start_block: int | None = None,
        end_block: int | None = None,
        attention_mask: torch.Tensor | None = None,
        prompts: torch.Tensor | None = None,
        extras: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gradients w.r.t. hidden (and prompts), by recomputing the forward with autograd."""
        start, end = self.check_range(start_block, end_block)
        x = check_pass(hidden, attention_mask, prompts, hidden_size=self.adapter.hidden_size,
                       n_blocks=end - start, extras=extras,
                       spec=self.extra_spec(start, end))  # fmt: skip
        grad = check_grad_outputs(grad_output, x.hidden)
        grads = self.run_backward(start, end, x.hidden, grad, x.attention_mask, x.prompts, x.extras)
        return grads[0], grads[1]

    # --- trusted entries: inputs validated by the caller (the wire edge, or the above) --------
    def _inputs(
        self, hidden: torch.Tensor, mask: torch.Tensor | None, prompts: torch.Tensor | None,
        extras: Mapping[str, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Tensors]:  # fmt: skip
        """(hidden, bool mask [B, T], prompts, extras) on the span's device and dtype: moved
        once."""
        if mask is None:
            mask_2d = torch.ones(hidden.shape[:2], dtype=torch.bool, device=self.device)
        else:
            mask_2d = mask.to(self.device, torch.bool)
        if prompts is not None:
            prompts = prompts.to(self.device, self.dtype)
        moved = {name: t.to(self.device, self.dtype) for name, t in (extras or {}).items()}
        return hidden.to(self.device, self.dtype), mask_2d, prompts, moved

    def run_forward(
        self, start: int, end: int, hidden: torch.Tensor, mask: torch.Tensor | None,
        prompts: torch.Tensor | None, extras: Mapping[str, torch.Tensor] | None = None,
        donate: tuple[int, ...] = (), states: bool = False,
    ) -> tuple[torch.Tensor, Tensors]:  # fmt: skip
        """Blocks [start, end) on validated inputs: ([B, T, H], the `donate` blocks' K/V of
        these tokens and, with `states`, each block's output), in hidden's dtype."""
        inputs, mask_2d, span_prompts, named = self._inputs(hidden, mask, prompts, extras)
        with torch.no_grad():
            out, donated = self.run_layers(tuple(range(start, end)), inputs, mask_2d, None,
                                           span_prompts, 0, named, donate, states)  # fmt: skip
        return out.to(hidden.dtype), {k: v.to(hidden.dtype) for k, v in donated.items()}

    def run_backward(
        self, start: int, end: int, hidden: torch.Tensor, grad_output: torch.Tensor,
        mask: torch.Tensor | None, prompts: torch.Tensor | None,
        extras: Mapping[str, torch.Tensor] | None = None,
        grad_extras: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, Tensors]:  # fmt: skip
        """Gradients w.r.t. validated inputs, recomputing the forward of [start, end):
        (hidden, prompts or None, each of `extras` by name). `grad_extras` are the gradients
        w.r.t. K/V these blocks donated (named as the forward gave them)."""
        inputs, mask_2d, span_prompts, named = self._inputs(hidden, mask, prompts, extras)
        grad_named = grad_extras or {}
        donate = tuple(sorted({kv_block(name) for name in grad_named}))
        with torch.enable_grad():
            inputs = inputs.detach().requires_grad_(True)
            named = {k: v.detach().requires_grad_(True) for k, v in named.items()}
            wanted = [inputs, *named.values()]
            if span_prompts is not None:
                span_prompts = span_prompts.detach().requires_grad_(True)
                wanted.append(span_prompts)
            out, donated = self.run_layers(tuple(range(start, end)), inputs, mask_2d, None,
                                           span_prompts, 0, named, donate)  # fmt: skip
            outs = [out, *(donated[k] for k in grad_named)]
            grads_out = [grad_output, *grad_named.values()]
            grads = torch.autograd.grad(
                outs, wanted, [g.to(self.device, out.dtype) for g in grads_out], allow_unused=True
            )
        grad_hidden = grads[0].to(hidden.dtype)
        grad_extras_in = {
            name: (g if g is not None else torch.zeros_like(t)).to(hidden.dtype)
            for (name, t), g in zip(named.items(), grads[1 : 1 + len(named)], strict=True)
        }
        if prompts is None or span_prompts is None:
            return grad_hidden, None, grad_extras_in
        grad_prompts = grads[-1] if grads[-1] is not None else torch.zeros_like(span_prompts)
        return grad_hidden, grad_prompts.to(prompts.dtype), grad_extras_in

    def new_session(
        self,
        *,
        batch_size: int,
        max_length: int,
        start_block: int | None = None,
        end_block: int | None = None,
    ) -> SpanSession:
        start, end = self.check_range(start_block, end_block)
        return SpanSession(self, start, end, batch_size=batch_size, max_length=max_length)


def _load_layer(
    adapter: Any, ckpt: Any, index: int, dtype: torch.dtype, device: torch.device, quant: str
) -> torch.nn.Module:
    """Block `index` built on meta, then given the checkpoint's tensors (nothing else read)."""
    prefix = adapter.layer_prefix.format(i=index)
    stored = ckpt.text_tensors(prefix)  # canonical prefix, read where the layout keeps it
    if not stored:
        raise BadRequest(f"no tensors for block {index}: {ckpt.layout.missing(prefix)}")
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
    del state, stored  # the layer holds its tensors: each is freed once quantized (below)
    leftover = [n for n, b in layer.named_buffers() if b.is_meta]
    if leftover:
        raise BadRequest(f"block {index} has buffers the checkpoint does not hold: {leftover}")
    layer.requires_grad_(False)
    if quant != "none":
        layer = quantize_layer(layer, quant, dtype, device)
    return layer.eval()
