"""DistributedModelForCausalLM: a transformers model whose blocks run on the swarm.

The client holds embeddings, final norm and head (ClientHead) and optional prompt tuning;
`model.model.layers` is a RemoteSequential. transformers' own generate() drives it: a
RemoteCache stands for the remote session (length, beam reordering via hypo_ids). State is
per call: generate() from several threads at once each opens (and closes) its own sessions;
`with model.inference_session(...)` applies to its own thread, and `generate(ids,
session=s)` continues an explicit session from any thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from drift.client.cache import RemoteCache
from drift.client.loading import load_parts
from drift.client.ptune import PromptTuning
from drift.client.remote import RemoteClient
from drift.client.sequential import RemoteSequential
from drift.client.session import InferenceSession

if TYPE_CHECKING:
    from drift.models.head import ClientHead


class DistributedBackbone(nn.Module):
    """`model.model`: the remote decoder stack (`layers`) and the client's embeddings."""

    def __init__(self, head: ClientHead, layers: RemoteSequential) -> None:
        super().__init__()
        self.embed_tokens = head.embed_tokens
        self.layers = layers


class DistributedPreTrainedModel(PreTrainedModel):
    config_class = PretrainedConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def _init_weights(self, module: nn.Module) -> None:  # weights come from the checkpoint
        return

    def _setup(self, ckpt: Any, head: ClientHead, client: RemoteClient, *, tuning_mode: str | None,
               pre_seq_len: int) -> None:  # fmt: skip
        self.head = head
        self.client = client
        self.num_blocks = _num_blocks(self.config)
        self.model = DistributedBackbone(head, RemoteSequential(client, 0, self.num_blocks))
        self.ptune = (
            PromptTuning(tuning_mode, pre_seq_len, self.config.hidden_size, self.num_blocks)
            if tuning_mode
            else None
        )
        if self.ptune is not None:
            self.head.requires_grad_(False)
        self._calls = _ThreadCalls()  # per thread: active session cache, sessions to close
        self._caches: dict[int, RemoteCache] = {}  # id(session) -> its cache, open sessions only
        self._caches_lock = threading.Lock()

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls, name_or_path: Any, *, initial_peers: Any, swarm_key: str | None = None,
        dtype: Any = None, torch_dtype: Any = None, client_config: Any = None,
        tuning_mode: str | None = None, pre_seq_len: int = 0, cache_dir: Any = None,
        revision: str | None = None, **config_overrides: Any,
    ):  # fmt: skip
        ckpt, head, client, torch_dt = load_parts(
            name_or_path, initial_peers=initial_peers, swarm_key=swarm_key, dtype=dtype,
            torch_dtype=torch_dtype, client_config=client_config, cache_dir=cache_dir,
            revision=revision,
        )  # fmt: skip
        config = ckpt.config.get_text_config()  # a multimodal checkpoint: its text tower
        for key, value in config_overrides.items():
            setattr(config, key, value)
        model = cls(config)
        model._setup(ckpt, head, client, tuning_mode=tuning_mode, pre_seq_len=pre_seq_len)
        model._load_extra(ckpt, torch_dt)
        if (ckpt.path / "generation_config.json").exists():
            model.generation_config = GenerationConfig.from_pretrained(ckpt.path)
        # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), whose stub
        # loses the binding and asks for `self` as the first argument
        return model.to(torch_dt).eval()  # type: ignore[arg-type]

    def _load_extra(self, ckpt: Any, dtype: torch.dtype) -> None:
        """Hook for heads beyond ClientHead (e.g. a classifier)."""

    def close(self) -> None:
        self.client.close()

    def _prompt_inputs(
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

    def _per_layer(
        self, input_ids: torch.Tensor | None, embeds: torch.Tensor, prefix: int
    ) -> torch.Tensor | None:
        """Gemma 4's per-layer inputs [B, prefix + T, L, P] for embeds [B, prefix + T, H]
        (with grad through the embeddings); None for other families."""
        pli = self.head.per_layer_inputs(input_ids, embeds, prefix=prefix)
        return None if pli is None else pli.to(embeds.dtype)

    @property
    def _active(self) -> RemoteCache | None:
        """The cache of this thread's `with model.inference_session()`, if any."""
        return self._calls.active

    @property
    def _owned(self) -> list[RemoteCache]:
        """Caches of the sessions this thread's running generate() opened for itself."""
        return self._calls.owned

    @contextlib.contextmanager
    def inference_session(
        self, *, max_length: int, batch_size: int = 1
    ) -> Iterator[InferenceSession]:
        """Keep one remote session across several generate() / forward calls of this thread.

        Other threads do not see it; they may use it explicitly with `generate(ids,
        session=s)` (one call at a time per session). Closed when the block exits.
        """
        if self._calls.active is not None:
            raise RuntimeError("an inference session is already active in this thread")
        session = self.open_session(max_length=max_length, batch_size=batch_size)
        self._calls.active = self.cache_for(session)
        try:
            yield session
        finally:
            self._calls.active = None
            session.close()
            with self._caches_lock:
                self._caches.pop(id(session), None)

    def open_session(self, *, max_length: int, batch_size: int = 1) -> InferenceSession:
        """A new remote session over all blocks; the caller closes it (or uses `with`)."""
        return self.model.layers.inference_session(
            max_length=max_length, batch_size=batch_size, dtype=self.dtype
        )

    def cache_for(self, session: InferenceSession) -> RemoteCache:
        """The one RemoteCache standing for `session` (what generate(session=...) uses)."""
        with self._caches_lock:
            for key in [k for k, c in self._caches.items() if c.session.closed]:
                del self._caches[key]
            cache = self._caches.get(id(session))
            if cache is None or cache.session is not session:
                cache = self._caches[id(session)] = RemoteCache(session, owned=False)
            return cache


class _ThreadCalls(threading.local):
    """Per-thread generation state of one model."""

    def __init__(self) -> None:
        self.active: RemoteCache | None = None
        self.owned: list[RemoteCache] = []


def _num_blocks(config: PretrainedConfig) -> int:
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot tell the number of blocks of a {config.model_type} config")


class DistributedModelForCausalLM(DistributedPreTrainedModel, GenerationMixin):
    """A causal LM whose decoder blocks run on the swarm; the client computes embeddings,
    final norm and logits, so logits and generate() match local transformers.

    Hidden states: with `output_hidden_states=True` (argument or config) `hidden_states` is
    the 2-tuple `(embeddings, final normed state)` -- the first and last entries of the
    tuple transformers returns. Per-layer states stay on the servers; for the output of
    blocks [0, k) run `model.model.layers[:k](embeddings)`. Without the flag it is None.
    """

    def get_input_embeddings(self) -> nn.Module:
        return self.head.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.head.lm_head

    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        cache: RemoteCache | None = None, inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None, position_ids: Any = None, use_cache: bool | None = None,
        return_dict: bool | None = None, output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0, **kwargs: Any,
    ) -> CausalLMOutputWithPast:  # fmt: skip
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("give input_ids or inputs_embeds")
            inputs_embeds = self.head.embed(input_ids)  # [B, T, H]
        cache = cache if cache is not None else self._active
        hidden = self._run_blocks(input_ids, inputs_embeds, attention_mask, cache)
        # generate() asks for the last position only: no [T, vocab] head over a whole prompt
        logits = self.head.logits(hidden if labels is not None else _kept(hidden, logits_to_keep))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        states = None
        if output_hidden_states or (
            output_hidden_states is None and self.config.output_hidden_states
        ):
            states = (inputs_embeds, self.head.norm(hidden.to(self.head.dtype)))
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache,
                                      hidden_states=states)  # fmt: skip

    def _run_blocks(
        self, input_ids: torch.Tensor | None, embeds: torch.Tensor,
        mask: torch.Tensor | None, cache: RemoteCache | None,
    ) -> torch.Tensor:  # fmt: skip
        t = embeds.shape[1]
        if cache is None:
            embeds, mask, prompts, p = self._prompt_inputs(embeds, mask)
            pli = self._per_layer(input_ids, embeds, p)
            hidden = self.model.layers(embeds, attention_mask=mask, prompts=prompts,
                                       per_layer_inputs=pli)  # fmt: skip
            return hidden[:, p:]
        new_mask = (
            mask[:, -t:] if mask is not None else torch.ones(embeds.shape[:2], dtype=torch.long)
        )
        p = 0
        prompts = None
        if cache.session.position == 0:
            cache.session.batch_size = embeds.shape[0]
            embeds, prefixed, prompts, p = self._prompt_inputs(embeds, new_mask)
            new_mask = cast(torch.Tensor, prefixed)  # a mask in gives a mask out
            cache.prefix_length = p
        send_mask = None if bool(new_mask.all()) else new_mask
        with torch.no_grad():
            pli = self._per_layer(input_ids, embeds, p)
            hidden = cache.session.step(
                embeds.detach(), hypo_ids=cache.take_hypo_ids(), attention_mask=send_mask,
                prompts=None if prompts is None else prompts.detach(), per_layer_inputs=pli,
            )  # fmt: skip
        cache.record(input_ids, new_mask[:, p:])
        return hidden[:, p:].to(embeds.dtype)

    # --- generate() integration -------------------------------------------------------------

    # transformers 5.24 annotates this `-> bool`, but its own body returns None on every path
    # and generate() discards the result: the job is to put a cache into model_kwargs.
    def _prepare_cache_for_generation(  # type: ignore[override]
        self, generation_config: Any, model_kwargs: dict, generation_mode: Any,
        batch_size: int, max_cache_length: int,
    ) -> None:  # fmt: skip
        # As transformers: a given cache is used as it is; use_cache=False opens no session
        # (every step then runs the whole sequence through the blocks).
        if model_kwargs.get("cache") is not None or generation_config.use_cache is False:
            return
        prefix = self.ptune.pre_seq_len if self.ptune is not None else 0
        beams = max(generation_config.num_beams or 1, generation_config.num_return_sequences or 1)
        session = self.open_session(
            max_length=max_cache_length + prefix, batch_size=batch_size * beams
        )
        model_kwargs["cache"] = RemoteCache(session, owned=True)
        self._calls.owned.append(model_kwargs["cache"])

    def generate(
        self, inputs: torch.Tensor | None = None, *args: Any,
        session: InferenceSession | None = None, **kwargs: Any,
    ) -> Any:  # fmt: skip
        """transformers' generate(), safe to call from several threads at once.

        With `session=` (from `open_session()` / `inference_session()`), or inside this
        thread's `with model.inference_session(...)`, it continues where the last call in
        that session stopped; otherwise it opens its own sessions and closes them on return.
        """
        if session is not None:
            if kwargs.get("cache") is not None:
                raise ValueError("give generate() either session= or cache=, not both")
            active: RemoteCache | None = self.cache_for(session)
        else:
            active = self._calls.active if kwargs.get("cache") is None else None
        if active is not None:
            if active.session.position > 0:
                inputs, kwargs = _resume_inputs(active, inputs, kwargs)
            kwargs["cache"] = active
        outer, self._calls.owned = self._calls.owned, []
        try:
            out = super().generate(inputs, *args, **kwargs)
        finally:
            owned, self._calls.owned = self._calls.owned, outer
            for cache in owned:
                cache.session.close()
        if active is not None:
            active.last_sequences = out if isinstance(out, torch.Tensor) else out.sequences
        return out


def _kept(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The positions transformers' `logits_to_keep` selects: last n (0 = all) or indices."""
    if isinstance(logits_to_keep, int):
        return hidden[:, -logits_to_keep:] if logits_to_keep > 0 else hidden
    return hidden[:, logits_to_keep]


def _resume_inputs(active: RemoteCache, inputs: torch.Tensor | None, kwargs: dict) -> tuple:
    """Full input ids for a generate() call that continues an active session."""
    history = active.last_sequences if active.last_sequences is not None else active.token_ids
    if inputs is None:
        if history is None:
            raise ValueError("this session began from inputs_embeds: give generate() input ids")
        inputs = history
    elif history is not None and not (
        inputs.shape[1] >= history.shape[1] and torch.equal(inputs[:, : history.shape[1]], history)
    ):
        inputs = torch.cat([history, inputs.to(history.device)], dim=1)  # new tokens appended
    if active.attention_mask is not None and kwargs.get("attention_mask") is None:
        seen = active.attention_mask
        extra = inputs.shape[1] - seen.shape[1]
        kwargs["attention_mask"] = torch.cat([seen, seen.new_ones(seen.shape[0], extra)], dim=1)
    return inputs, kwargs
