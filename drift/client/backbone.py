"""DistributedBaseModel: `model.model` (also `model.transformer`), a transformers base model
whose blocks run on the swarm.

Embeddings, the remote blocks and the final norm, under transformers' and Petals' names
(`embed_tokens`/`word_embeddings`, `layers`/`h`, `norm`/`ln_f`). `forward` runs the blocks
statelessly or through a RemoteCache and gives the normed last state, the cache to continue
from (drift.client.forward_cache) and, when asked, one hidden state per block. Knows nothing
of logits or generate().
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from drift.client.cache import RemoteCache
from drift.client.forward_cache import ForwardCache, Pending
from drift.client.ptune import PromptTuning
from drift.client.sequential import RemoteSequential

if TYPE_CHECKING:
    from drift.models.head import ClientHead

Blocks = tuple[torch.Tensor, torch.Tensor | None]  # (last block's output, each block's output)


class ThreadCalls(threading.local):
    """Per-thread generation state of one model."""

    def __init__(self) -> None:
        self.active: RemoteCache | None = None  # this thread's `with inference_session()`
        self.owned: list[RemoteCache] = []  # sessions this thread's generate() opened


class DistributedBaseModel(nn.Module):
    def __init__(self, config: PretrainedConfig, head: ClientHead, layers: RemoteSequential,
                 ptune: PromptTuning | None) -> None:  # fmt: skip
        super().__init__()
        self.config = config
        self.head = head
        self.embed_tokens = head.embed_tokens
        self.layers = layers
        self.norm = head.norm
        self.ptune = ptune
        self.calls = ThreadCalls()

    # --- Petals' names (and bloom's and falcon's in transformers) ----------------------------
    @property
    def word_embeddings(self) -> nn.Module:
        return self.embed_tokens

    @property
    def word_embeddings_layernorm(self) -> nn.Module:
        return self.head.embed_norm if self.head.embed_norm is not None else nn.Identity()

    @property
    def h(self) -> RemoteSequential:
        return self.layers

    @property
    def ln_f(self) -> nn.Module:
        return self.norm

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    # --- forward ---------------------------------------------------------------------------
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        position_ids: Any = None, cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None, use_cache: bool | None = None,
        output_hidden_states: bool | None = None, output_attentions: bool | None = None,
        return_dict: bool | None = None, **kwargs: Any,
    ) -> BaseModelOutputWithPast:  # fmt: skip
        """As transformers' base models: the final normed state [B, T, H]; `cache` a remote
        cache to continue from (with use_cache, the config's by default); `hidden_states`
        block 0's input, each block's output but the last, and the final normed state."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if output_attentions:
            raise ValueError("output_attentions is not available: attention weights stay on "
                             "the servers")  # fmt: skip
        if inputs_embeds is None:
            hidden = self.head.embed(cast(torch.Tensor, input_ids))  # [B, T, H]
        else:
            hidden = self.head.block_input(inputs_embeds)
        states = (
            output_hidden_states
            if output_hidden_states is not None
            else bool(self.config.output_hidden_states)
        )
        cache, stateless = self._cache(cache, use_cache, hidden)
        if stateless:
            out, blocks = self._stateless(input_ids, hidden, attention_mask, states)
            if isinstance(cache, ForwardCache):  # a later call sends these inputs first
                cache.pending = Pending(_detached(input_ids), hidden.detach(),
                                        _new_mask(attention_mask, hidden))  # fmt: skip
        else:
            assert cache is not None
            out, blocks = self._cached(input_ids, hidden, attention_mask, cache, states)
        normed = self.norm(out.to(self.head.embed_tokens.weight.device, self.head.dtype))
        hidden_states = None
        if states:
            assert blocks is not None
            hidden_states = (hidden, *blocks.unbind(dim=2)[:-1], normed)
        return BaseModelOutputWithPast(last_hidden_state=normed, cache=cache,
                                       hidden_states=hidden_states)  # fmt: skip

    def _cache(self, cache: Cache | None, use_cache: bool | None,
               hidden: torch.Tensor) -> tuple[RemoteCache | None, bool]:  # fmt: skip
        """(the cache a call returns, whether the call runs stateless): the given cache, this
        thread's session's, or a new ForwardCache (stepped now with use_cache=True and no
        gradient wanted, else given the call's inputs for later)."""
        if cache is not None:
            if not isinstance(cache, RemoteCache):
                raise ValueError(
                    f"a {type(cache).__name__} cannot hold this model's keys and values: they "
                    "stay on the servers. Pass no cache (use_cache=True) and continue from "
                    "the output's `past_key_values`, or use model.inference_session()"
                )
            return cache, False
        if self.calls.active is not None:
            return self.calls.active, False
        wanted = use_cache if use_cache is not None else bool(self.config.use_cache)
        if not wanted:
            return None, True
        client = self.layers.client
        session = self.layers.inference_session(
            max_length=client.config.cache_headroom_tokens, batch_size=hidden.shape[0],
            dtype=self.head.dtype,
        )  # fmt: skip
        cache = ForwardCache(session, headroom=client.config.cache_headroom_tokens)
        return cache, not use_cache or self._needs_grad(hidden)

    def _needs_grad(self, hidden: torch.Tensor) -> bool:
        if not torch.is_grad_enabled():
            return False
        tuned = [*(self.ptune.parameters() if self.ptune is not None else ()),
                 *(self.layers.lora.parameters() if self.layers.lora is not None else ())]  # fmt: skip
        return hidden.requires_grad or any(p.requires_grad for p in tuned)

    def _stateless(self, input_ids: torch.Tensor | None, hidden: torch.Tensor,
                   mask: torch.Tensor | None, states: bool) -> Blocks:  # fmt: skip
        embeds, mask, prompts, p = self.prompt_inputs(hidden, mask)
        pli = self.per_layer(input_ids, embeds, p)
        if states:
            out, blocks = self.layers.forward_with_states(embeds, attention_mask=mask,
                                                          prompts=prompts, per_layer_inputs=pli)  # fmt: skip
            return out[:, p:], blocks[:, p:]
        out = self.layers(embeds, attention_mask=mask, prompts=prompts, per_layer_inputs=pli)
        return out[:, p:], None

    def _cached(self, input_ids: torch.Tensor | None, hidden: torch.Tensor,
                mask: torch.Tensor | None, cache: RemoteCache, states: bool) -> Blocks:  # fmt: skip
        """New tokens through the cache's session (after a ForwardCache's pending inputs)."""
        new_mask = _new_mask(mask, hidden)
        pending = cache.take_pending() if isinstance(cache, ForwardCache) else None
        skip = 0 if pending is None else pending.hidden.shape[1]
        if pending is not None and skip:
            hidden = torch.cat([pending.hidden.to(hidden), hidden], dim=1)  # [B, P + T, H]
            new_mask = torch.cat([pending.mask.to(new_mask), new_mask], dim=1)
            input_ids = (
                None
                if input_ids is None or pending.input_ids is None
                else torch.cat([pending.input_ids.to(input_ids), input_ids], dim=1)
            )
        try:
            out, blocks = self._step(input_ids, hidden, new_mask, cache, states)
        except BaseException:
            if isinstance(cache, ForwardCache):
                cache.pending = pending  # the session is where it was: keep them waiting
            raise
        return out[:, skip:], None if blocks is None else blocks[:, skip:]

    def _step(self, input_ids: torch.Tensor | None, hidden: torch.Tensor,
              new_mask: torch.Tensor, cache: RemoteCache, states: bool) -> Blocks:  # fmt: skip
        p, prompts = 0, None
        if cache.session.position == 0:
            cache.session.batch_size = hidden.shape[0]
            hidden, prefixed, prompts, p = self.prompt_inputs(hidden, new_mask)
            new_mask = cast(torch.Tensor, prefixed)  # a mask in gives a mask out
            cache.prefix_length = p
        if isinstance(cache, ForwardCache):
            cache.make_room(hidden.shape[1])
        send_mask = None if bool(new_mask.all()) else new_mask
        with torch.no_grad():
            pli = self.per_layer(input_ids, hidden, p)
            kwargs: dict[str, Any] = dict(
                hypo_ids=cache.take_hypo_ids(), attention_mask=send_mask,
                prompts=None if prompts is None else prompts.detach(), per_layer_inputs=pli,
            )  # fmt: skip
            if states:
                out, blocks = cache.session.step_with_states(hidden.detach(), **kwargs)
            else:
                out, blocks = cache.session.step(hidden.detach(), **kwargs), None
        cache.record(input_ids, new_mask[:, p:])
        return out[:, p:], None if blocks is None else blocks[:, p:]

    def prompt_inputs(
        self, embeds: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]:
        """Prepend prompt-tuning embeddings: (embeds, mask, deep prompts, prefix length)."""
        if self.ptune is None:
            return embeds, mask, None, 0
        b, p = embeds.shape[0], self.ptune.pre_seq_len
        embeds = torch.cat([self.ptune.prefix(b, embeds.dtype), embeds], dim=1)  # [B, P+T, H]
        if mask is not None:
            mask = torch.cat([mask.new_ones(b, p), mask], dim=1)
        return embeds, mask, self.ptune.prompts(b, embeds.dtype), p

    def per_layer(
        self, input_ids: torch.Tensor | None, embeds: torch.Tensor, prefix: int
    ) -> torch.Tensor | None:
        """Gemma 4's per-layer inputs [B, prefix + T, L, P] for embeds [B, prefix + T, H]
        (with grad through the embeddings); None for other families."""
        pli = self.head.per_layer_inputs(input_ids, embeds, prefix=prefix)
        return None if pli is None else pli.to(embeds.dtype)


def _new_mask(mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """The mask of a call's new tokens [B, T]: the last T columns of a mask over past + new
    tokens (what generate() passes), ones when none is given."""
    t = hidden.shape[1]
    if mask is None:
        return torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
    return mask[:, mask.shape[1] - t :]


def _detached(ids: torch.Tensor | None) -> torch.Tensor | None:
    return None if ids is None else ids.detach()
