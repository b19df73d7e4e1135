"""ClientHead: what a client holds of a model: embeddings, final norm and the LM head.

Loads only those tensors. Applies the family's client-side pieces from its adapter: gemma's
embedding scale, bloom's embedding layernorm, gemma2's final logit softcapping, tied heads.
"""

from __future__ import annotations

from typing import Any

import torch

from drift.models.registry import get_adapter
from drift.wire.errors import BadRequest, BadTensor


class ClientHead(torch.nn.Module):
    def __init__(
        self,
        adapter: Any,
        embed: torch.nn.Embedding,
        norm: torch.nn.Module,
        lm_head: torch.nn.Linear,
        embed_norm: torch.nn.Module | None,
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.config = adapter.config
        self.embed_tokens = embed
        self.norm = norm
        self.lm_head = lm_head
        self.embed_norm = embed_norm
        self.embed_scale = adapter.embed_scale()
        self.softcap = adapter.logit_softcap()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @classmethod
    def load(
        cls, ckpt: Any, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> ClientHead:
        adapter = get_adapter(ckpt.config)
        device = torch.device(device)

        def read(prefix: str) -> dict[str, torch.Tensor]:
            return {k: v.to(device, dtype) for k, v in ckpt.tensors(prefix).items()}

        embed_weight = _one(ckpt, adapter.embed_name, read)
        embed = torch.nn.Embedding.from_pretrained(embed_weight, freeze=True)
        head_name = "lm_head.weight"
        tied = bool(getattr(adapter.config, "tie_word_embeddings", False))
        if not tied and head_name not in ckpt.tensor_names():
            raise BadRequest(f"the checkpoint has no {head_name} and its embeddings are not tied")
        head_weight = embed_weight if tied else _one(ckpt, head_name, read)
        lm_head = torch.nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
        lm_head.weight = (
            embed.weight if tied else torch.nn.Parameter(head_weight, requires_grad=False)
        )
        norm = _loaded(adapter.build_final_norm(), read(adapter.norm_prefix), "final norm")
        embed_norm = adapter.build_embed_norm()
        if embed_norm is not None:
            prefix = adapter.embed_norm_prefix
            assert prefix is not None, f"{type(adapter).__name__} builds an unnamed embedding norm"
            embed_norm = _loaded(embed_norm, read(prefix), "embedding norm").to(device, dtype)
        head = cls(adapter, embed, norm.to(device, dtype), lm_head, embed_norm)
        head.requires_grad_(False)
        return head.eval()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] token ids -> [B, T, H] hidden states entering block 0."""
        if input_ids.ndim != 2 or input_ids.is_floating_point():
            raise BadTensor(
                f"input_ids must be integers of rank 2 [batch, tokens], got {tuple(input_ids.shape)}"
            )
        vocab = self.embed_tokens.num_embeddings
        if bool(((input_ids < 0) | (input_ids >= vocab)).any()):
            raise BadTensor(f"input_ids must lie in [0, {vocab})")
        hidden = self.embed_tokens(input_ids.to(self.embed_tokens.weight.device))
        if self.embed_scale is not None:
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        if self.embed_norm is not None:
            hidden = self.embed_norm(hidden)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, H] output of the last block -> [B, T, V] logits (final norm + head)."""
        hidden = hidden.to(self.embed_tokens.weight.device, self.dtype)
        logits = self.lm_head(self.norm(hidden))
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _one(ckpt: Any, name: str, read: Any) -> torch.Tensor:
    found = read(name)
    if "" not in found:
        raise BadRequest(f"the checkpoint has no tensor {name!r}")
    return found[""]


def _loaded(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> torch.nn.Module:
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise BadRequest(f"the checkpoint's {what} does not match the config: {exc}") from exc
    return module
