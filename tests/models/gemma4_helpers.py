"""Gemma 4 span tests: tiny checkpoints, their full transformers models, and a client-side
chain that passes per-layer inputs and shared keys/values between spans (as the SDK does).

The tiny configs (tests/tiny_models.py) have 6 blocks s s f s s f; blocks 4 and 5 read the
keys/values of donors 3 and 2. CUTS lists every boundary set used: each single cut that
separates a donor from its consumer (3, 4, 5), one that does not (2), and a 3-way split
whose middle span both donates (3 -> 4) and passes a donor through (2 -> 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from drift.models.checkpoint import Checkpoint
from drift.models.head import ClientHead
from drift.models.span import ModelSpan
from drift.wire.extras import PER_LAYER_INPUTS, kv_names
from tests.tiny_models import save_tiny

NUM_BLOCKS = 6
CUTS: tuple[tuple[int, ...], ...] = ((3,), (4,), (5,), (2,), (3, 5))
Tensors = dict[str, torch.Tensor]


@dataclass
class G4:
    family: str
    ckpt: Checkpoint
    reference: torch.nn.Module  # the full transformers model, float32, same weights
    head: ClientHead
    _spans: dict[tuple[int, int], ModelSpan] = field(default_factory=dict)

    def spans(self, cuts: tuple[int, ...]) -> list[ModelSpan]:
        bounds = [0, *cuts, NUM_BLOCKS]
        out = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            if (a, b) not in self._spans:
                self._spans[a, b] = ModelSpan.load(self.ckpt, a, b)
            out.append(self._spans[a, b])
        return out

    @property
    def text_model(self) -> torch.nn.Module:
        """The reference's Gemma4(Unified)TextModel (the text tower of a multimodal one)."""
        base = self.reference.model
        return getattr(base, "language_model", base)


def load_g4(family: str, directory: Path) -> G4:
    save_tiny(family, directory)
    ckpt = Checkpoint(directory)
    # default attention: sdpa for the text tower (the multimodal audio tower has none)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return G4(family, ckpt, reference, ClientHead.load(ckpt))


def extras_for(g: G4, a: int, b: int, per_layer: torch.Tensor | None, shared: Tensors) -> Tensors:
    """What blocks [a, b) take: their per-layer inputs and the K/V they read of donors."""
    out: Tensors = {}
    if per_layer is not None:
        out[PER_LAYER_INPUTS] = per_layer[:, :, a:b]
    for donor in g.head.sharing.consumed(a, b):
        for name in kv_names(donor):
            out[name] = shared[name]
    return out


@dataclass(frozen=True)
class Hop:
    span: ModelSpan
    hidden: torch.Tensor
    extras: Tensors
    donate: tuple[int, ...]


def chain_forward(
    g: G4, spans: list[ModelSpan], embeds: torch.Tensor, per_layer: torch.Tensor | None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[Hop]]:  # fmt: skip
    """Stateless pass through `spans`; also each span's inputs (for the backward)."""
    shared: Tensors = {}
    hops = []
    hidden = embeds
    for span in spans:
        a, b = span.start_block, span.end_block
        extras = extras_for(g, a, b, per_layer, shared)
        donate = g.head.sharing.donated(a, b, NUM_BLOCKS)
        hops.append(Hop(span, hidden, extras, donate))
        hidden, donated = span.run_forward(a, b, hidden, mask, None, extras, donate)
        shared.update(donated)
    return hidden, hops


def chain_backward(
    hops: list[Hop], grad: torch.Tensor, per_layer: torch.Tensor | None, mask=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients w.r.t. the chain's input and its per-layer inputs; K/V grads go back to
    the spans that donated them (summed over the spans that read them)."""
    grad_kv: Tensors = {}
    grad_per_layer = torch.zeros_like(per_layer) if per_layer is not None else None
    for hop in reversed(hops):
        a, b = hop.span.start_block, hop.span.end_block
        grad_out = {n: grad_kv.pop(n) for d in hop.donate for n in kv_names(d)}
        grad, _, grads = hop.span.run_backward(a, b, hop.hidden, grad, mask, None, hop.extras,
                                               grad_out)  # fmt: skip
        for name, value in grads.items():
            if name == PER_LAYER_INPUTS:
                assert grad_per_layer is not None
                grad_per_layer[:, :, a:b] += value
            else:
                grad_kv[name] = grad_kv[name] + value if name in grad_kv else value
    assert not grad_kv, f"gradients for K/V nobody donated: {sorted(grad_kv)}"
    return grad, grad_per_layer


class ChainSession:
    """One SpanSession per span, stepped together like the SDK's InferenceSession."""

    def __init__(self, g: G4, cuts: tuple[int, ...], *, batch_size: int, max_length: int):
        self.g = g
        self.sessions = [
            s.new_session(batch_size=batch_size, max_length=max_length) for s in g.spans(cuts)
        ]

    def step(self, ids: torch.Tensor, *, position: int, mask: torch.Tensor | None = None,
             hypo_ids: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Logits [B, T, V] of new tokens `ids` [B, T] at `position`."""
        embeds = self.g.head.embed(ids)
        per_layer = self.g.head.per_layer_inputs(ids, embeds)
        shared: Tensors = {}
        hidden = embeds
        for session in self.sessions:
            a, b = session.start_block, session.end_block
            hidden, donated = session.run(
                position, hidden, hypo_ids=hypo_ids, attention_mask=mask,
                extras=extras_for(self.g, a, b, per_layer, shared),
                donate=self.g.head.sharing.donated(a, b, NUM_BLOCKS),
            )  # fmt: skip
            shared.update(donated)
        return self.g.head.logits(hidden)
