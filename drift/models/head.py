"""ClientHead: what a client holds of a model: embeddings, final norm and the LM head.

Loads only those tensors (by canonical names, wherever the checkpoint's layout keeps them:
drift.models.layout). Applies the family's client-side pieces from its adapter: gemma's
embedding scale (inside `embed_tokens`, as transformers' scaled embeddings), bloom's
embedding layernorm, gemma2's final logit softcapping, tied heads, Gemma 4's per-layer
inputs (computed here from the token ids, sent to every span).
"""

from __future__ import annotations

from typing import Any

import torch

from drift.models.registry import get_adapter
from drift.models.row_kernel import product_of
from drift.models.rows import RowPads, linear
from drift.models.sharing import KVSharing
from drift.wire.errors import BadRequest, BadTensor


class ScaledEmbedding(torch.nn.Embedding):
    """An embedding table whose rows come out times `scale` (transformers' gemma
    `*ScaledWordEmbedding`: what `get_input_embeddings()` of those models returns)."""

    def __init__(self, weight: torch.Tensor, scale: float) -> None:
        super().__init__(weight.shape[0], weight.shape[1], _weight=weight, _freeze=True)
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = super().forward(input_ids)
        return hidden * torch.tensor(self.scale, dtype=hidden.dtype)


class ClientHead(torch.nn.Module):
    def __init__(
        self,
        adapter: Any,
        embed: torch.nn.Embedding,
        norm: torch.nn.Module,
        lm_head: torch.nn.Linear,
        embed_norm: torch.nn.Module | None,
        per_layer: torch.nn.Module | None = None,
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
        self.per_layer = per_layer  # Gemma 4: per-layer input embeddings and projection
        self.row_pads: RowPads = {}  # few-row products padded (drift.models.rows), measured
        self.pad_id = int(getattr(self.config, "pad_token_id", None) or 0)
        # ids embedded as the pad token (a multimodal checkpoint's image/audio stand-ins)
        self.placeholders = torch.tensor(adapter.placeholder_ids(), dtype=torch.long)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def sharing(self) -> KVSharing:
        """Which blocks reuse other blocks' keys/values (the client carries them between)."""
        return self.adapter.sharing

    @classmethod
    def load(
        cls, ckpt: Any, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> ClientHead:
        adapter = get_adapter(ckpt.config)
        device = torch.device(device)

        def read(canonical: str) -> dict[str, torch.Tensor]:  # where the layout stores it
            return {k: v.to(device, dtype) for k, v in ckpt.text_tensors(canonical).items()}

        embed_weight = _one(ckpt, adapter.embed_name, read)
        scale = adapter.embed_scale()
        embed = (
            torch.nn.Embedding.from_pretrained(embed_weight, freeze=True)
            if scale is None
            else ScaledEmbedding(embed_weight, scale)
        )
        head_name = "lm_head.weight"
        # a multimodal model ties as its own (outer) config says, as transformers does
        tied = bool(getattr(ckpt.config, "tie_word_embeddings",
                            getattr(adapter.config, "tie_word_embeddings", False)))  # fmt: skip
        if not tied and ckpt.layout.stored(head_name) not in ckpt.tensor_names():
            raise BadRequest(f"{ckpt.layout.missing(head_name)} and its embeddings are not tied")
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
        per_layer = None
        if (built := adapter.build_per_layer()) is not None:
            module, prefix = built  # read by exact names: never the blocks under the prefix
            state = {name: _one(ckpt, prefix + name, read) for name in module.state_dict()}
            per_layer = _loaded(module, state, "per-layer input embeddings").to(device, dtype)
        head = cls(adapter, embed, norm.to(device, dtype), lm_head, embed_norm, per_layer)
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
        return self.block_input(self.embed_tokens(self._text_ids(input_ids)))

    def block_input(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        """[B, T, H] what `embed_tokens` gave (a model's `inputs_embeds`) -> what block 0 takes:
        bloom's embedding layernorm applied, as its model's forward does; others unchanged."""
        if self.embed_norm is None:
            return inputs_embeds
        return self.embed_norm(inputs_embeds.to(self.embed_tokens.weight.device, self.dtype))

    def per_layer_inputs(
        self, input_ids: torch.Tensor | None, embeds: torch.Tensor, *, prefix: int = 0
    ) -> torch.Tensor | None:
        """[B, prefix + T, L, P] per-layer inputs for embeds [B, prefix + T, H] (None for
        families without them). `prefix` soft tokens (prompt tuning) count as the pad token,
        as transformers does for image tokens; without input_ids the ids are recovered from
        the embeddings, which must then be exact rows of the embedding table."""
        if self.per_layer is None:
            return None
        if input_ids is None:
            input_ids = self._ids_of(embeds[:, prefix:])
        ids = self._text_ids(input_ids)
        if prefix:
            ids = torch.cat([ids.new_full((ids.shape[0], prefix), self.pad_id), ids], dim=1)
        return self.per_layer(ids, embeds.to(self.dtype))

    def _text_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids on the embeddings' device, placeholders (multimodal stand-ins) as pad."""
        ids = input_ids.to(self.embed_tokens.weight.device)
        if self.placeholders.numel():
            ids = ids.masked_fill(torch.isin(ids, self.placeholders.to(ids.device)), self.pad_id)
        return ids

    def _ids_of(self, embeds: torch.Tensor) -> torch.Tensor:
        """[B, T] token ids whose embeddings are exactly `embeds` [B, T, H] (as transformers
        recovers them for Gemma 4), without building the scaled table."""
        with torch.no_grad():
            weight = self.embed_tokens.weight  # [V, H]
            scale = float(self.embed_scale or 1.0)
            wanted = embeds.detach().to(weight.dtype)
            # the nearest row of scale * W: argmax of 2 s e.w - s^2 |w|^2, then checked exact
            norms = torch.linalg.vector_norm(weight, dim=-1) ** 2  # [V]
            found = (2 * scale * (wanted @ weight.T) - scale**2 * norms).argmax(-1)  # [B, T]
            if not torch.equal(self.embed(found), wanted):
                raise BadTensor(
                    "Gemma 4's per-layer inputs need the token ids: pass input_ids (or "
                    "inputs_embeds that are exact rows of the embedding table)"
                )
        return found

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, H] output of the last block -> [B, T, V] logits (final norm + head)."""
        return self.project(self.norm(hidden.to(self.embed_tokens.weight.device, self.dtype)))

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """[B, T, H] final normed state -> [B, T, V] logits (head + gemma2's softcapping);
        a few rows padded per `row_pads`."""
        head = self.lm_head
        if self.row_pads and type(head) is torch.nn.Linear:
            product = product_of(head)  # drift.models.row_kernel's, where installed
            return self.capped(linear(normed, head.weight, head.bias, self.row_pads, product))
        return self.capped(head(normed))

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's final logit softcapping (gemma2's) of raw head products, else as is."""
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


def _one(ckpt: Any, name: str, read: Any) -> torch.Tensor:
    found = read(name)
    if "" not in found:
        raise BadRequest(ckpt.layout.missing(name))
    return found[""]


def _loaded(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> torch.nn.Module:
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise BadRequest(f"the checkpoint's {what} does not match the config: {exc}") from exc
    return module
