"""DistributedModelForCausalLM: a transformers model whose blocks run on the swarm.

The client holds embeddings, final norm and head (ClientHead) and optional prompt tuning
or LoRA weights (trained here, applied by the servers: drift.client.lora);
`model.model` (also `model.transformer`, Petals' name) is a DistributedBaseModel whose
`layers` are a RemoteSequential. transformers' own generate() drives it: a RemoteCache
stands for the remote session (length, beam reordering via hypo_ids, rollback). State is
per call: generate() from several threads at once each opens (and closes) its own sessions;
`with model.inference_session(...)` applies to its own thread, and `generate(ids,
session=s)` continues an explicit session from any thread. `close()` (or `with`) frees the
connections; a model never closed is closed when collected or at interpreter exit.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from drift.client.backbone import DistributedBaseModel, ThreadCalls
from drift.client.cache import RemoteCache
from drift.client.chain import MakeRoom
from drift.client.head_threads import generate_threads, head_row_pads
from drift.client.loading import load_parts, open_client_model
from drift.client.lora import ClientLora, client_lora
from drift.client.pretrained_args import apply_overrides, check_config, drop_ignored
from drift.client.ptune import PromptTuning
from drift.client.remote import RemoteClient
from drift.client.sequential import RemoteSequential
from drift.client.session import InferenceSession
from drift.client.shared_head import SharedHead
from drift.models.row_kernel import activated, kernel_in
from drift.models.threads import threads

if TYPE_CHECKING:
    from drift.models.head import ClientHead


class DistributedPreTrainedModel(PreTrainedModel):
    config_class = PretrainedConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def _init_weights(self, module: nn.Module) -> None:  # weights come from the checkpoint
        return

    def _setup(self, ckpt: Any, head: ClientHead, client: RemoteClient, *, tuning_mode: str | None,
               pre_seq_len: int, lora_config: Any = None) -> None:  # fmt: skip
        self.head = head
        self.shared_head = SharedHead(head)  # concurrent generate() calls share its weights' read
        self.client = client
        # torch threads generate() runs on (None: torch's own), set by from_pretrained
        # (drift.client.head_threads), and the seconds it measured
        self.generate_threads: int | None = None
        self.generate_threads_s: dict[int, float] = {}
        self.num_blocks = _num_blocks(self.config)
        self.base_model_name = str(ckpt.name)  # what a saved LoRA adapter names as its base
        client.adapter_of = functools.partial(getattr, self.config, "active_adapter", None)
        lora = None
        if tuning_mode == "lora" or lora_config is not None:
            if tuning_mode not in (None, "lora"):
                raise ValueError(f"lora_config goes with tuning_mode='lora', not {tuning_mode!r}")
            lora = client_lora(self.config, lora_config, self.num_blocks)
        ptune = (
            PromptTuning(tuning_mode, pre_seq_len, self.config.hidden_size, self.num_blocks)
            if tuning_mode and lora is None
            else None
        )
        if ptune is not None or lora is not None:
            self.head.requires_grad_(False)
        layers = RemoteSequential(client, 0, self.num_blocks, lora)
        self.model = DistributedBaseModel(self.config, head, layers, ptune)
        self._caches: dict[int, RemoteCache] = {}  # id(session) -> its cache, open sessions only
        self._caches_lock = threading.Lock()

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls, name_or_path: Any = None, *, initial_peers: Any, swarm_key: str | None = None,
        dtype: Any = None, torch_dtype: Any = None, device: Any = None,
        client_config: Any = None, tuning_mode: str | None = None, pre_seq_len: int = 0,
        cache_dir: Any = None, revision: str | None = None, token: str | bool | None = None,
        config: Any = None, lora_config: Any = None, active_adapter: str | None = None,
        **kwargs: Any,
    ):  # fmt: skip
        """transformers' from_pretrained for a swarm: `initial_peers` (join tokens or
        multiaddrs) and `swarm_key` find it; `name_or_path` is a local path, alias or Hub id
        (which win), else the name the swarm announces (its client parts are downloaded
        once and cached; None: the swarm's only model); `device` places the client's own parts; other
        keyword arguments are config fields, or ignored with a warning saying why
        (drift.client.pretrained_args). `tuning_mode="lora"` with `lora_config` (a peft
        LoraConfig, a dict of its fields, or a saved adapter's directory to go on training)
        trains LoRA weights through the swarm;
        `active_adapter` applies a LoRA adapter the servers hold (`--adapters`)."""
        overrides = drop_ignored(kwargs)
        resolved = open_client_model(name_or_path, cache_dir=cache_dir, revision=revision,
                                     token=token, initial_peers=initial_peers,
                                     swarm_key=swarm_key)  # fmt: skip
        ckpt = resolved.ckpt
        # a multimodal checkpoint: its text tower; a copy, the checkpoint's stays as read
        text_config = copy.deepcopy(ckpt.config.get_text_config())
        if config is not None:
            text_config = check_config(config, text_config)
        apply_overrides(text_config, overrides)
        ckpt, head, client, torch_dt = load_parts(
            resolved, initial_peers=initial_peers, swarm_key=swarm_key, dtype=dtype,
            torch_dtype=torch_dtype, client_config=client_config, device=device,
        )  # fmt: skip
        if active_adapter is not None:
            text_config.active_adapter = active_adapter  # where Petals keeps it too
        model = cls(text_config)
        model._setup(ckpt, head, client, tuning_mode=tuning_mode, pre_seq_len=pre_seq_len,
                     lora_config=lora_config)  # fmt: skip
        model._load_extra(ckpt, torch_dt)
        if (ckpt.path / "generation_config.json").exists():
            model.generation_config = GenerationConfig.from_pretrained(ckpt.path)
        # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to), whose stub
        # loses the binding and asks for `self` as the first argument
        model = model.to(head.embed_tokens.weight.device, torch_dt).eval()  # type: ignore[arg-type]
        model.generate_threads, model.generate_threads_s = generate_threads(
            head, client, client.config.generate_threads
        )  # fmt: skip
        head_row_pads(head, model.generate_threads)
        return model

    def _load_extra(self, ckpt: Any, dtype: torch.dtype) -> None:
        """Hook for heads beyond ClientHead (e.g. a classifier)."""

    def close(self) -> None:
        """Close the connections to the swarm (the servers free this model's sessions)."""
        self.client.close()

    def __enter__(self) -> DistributedPreTrainedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- Petals' and transformers' names -----------------------------------------------------
    @property
    def transformer(self) -> DistributedBaseModel:
        """Petals' name for `model.model` (bloom's and falcon's in transformers)."""
        return self.model

    @property
    def lm_head(self) -> nn.Module:
        return self.head.lm_head

    @property
    def ptune(self) -> PromptTuning | None:
        return self.model.ptune

    # --- LoRA ------------------------------------------------------------------------------------
    @property
    def lora(self) -> ClientLora | None:
        """The LoRA weights trained through the swarm (tuning_mode="lora"), or None."""
        return self.model.layers.lora

    @property
    def active_adapter(self) -> str | None:
        """The served LoRA adapter this model's requests and new sessions ask for (kept in
        `config.active_adapter`, as Petals does)."""
        return self.client.adapter

    @active_adapter.setter
    def active_adapter(self, name: str | None) -> None:
        self.config.active_adapter = name

    def save_lora(self, directory: Any) -> None:
        """Write the trained LoRA weights as a peft adapter (adapter_config.json and
        adapter_model.safetensors): plain peft loads it onto the local model, and
        `drift server --adapters` serves it."""
        if self.lora is None:
            raise ValueError("this model trains no LoRA weights: open it with tuning_mode='lora'")
        self.lora.save(directory, self.base_model_name)

    def get_input_embeddings(self) -> nn.Module:
        return self.head.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.head.lm_head

    # --- sessions ------------------------------------------------------------------------------
    @property
    def _calls(self) -> ThreadCalls:
        return self.model.calls

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
        self, *, max_length: int, batch_size: int = 1, active_adapter: str | None = None
    ) -> Iterator[InferenceSession]:
        """Keep one remote session across several generate() / forward calls of this thread.

        Other threads do not see it; they may use it explicitly with `generate(ids,
        session=s)` (one call at a time per session). Closed when the block exits.
        """
        if self._calls.active is not None:
            raise RuntimeError("an inference session is already active in this thread")
        session = self.open_session(max_length=max_length, batch_size=batch_size,
                                    active_adapter=active_adapter)  # fmt: skip
        self._calls.active = self.cache_for(session)
        try:
            yield session
        finally:
            self._calls.active = None
            session.close()
            with self._caches_lock:
                self._caches.pop(id(session), None)

    def open_session(self, *, max_length: int, batch_size: int = 1,
                     active_adapter: str | None = None, headroom: int = 0,
                     make_room: MakeRoom | None = None) -> InferenceSession:  # fmt: skip
        """A new remote session over all blocks; the caller closes it (or uses `with`). It
        opens with its first step (`connect()` opens it now). `active_adapter`: a served
        LoRA adapter for this session (default: the model's). `headroom`: tokens of
        `max_length` it may open without where servers refuse them (past their limit, or no
        room); `make_room`: awaited where no server has room, True when it freed some
        (InferenceSession's)."""
        return self.model.layers.inference_session(
            max_length=max_length, batch_size=batch_size, dtype=self.dtype,
            active_adapter=active_adapter, headroom=headroom, make_room=make_room,
        )  # fmt: skip

    def fork_session(self, session: InferenceSession, batch_size: int, *,
                     max_length: int | None = None,
                     tokens: int | None = None) -> InferenceSession:  # fmt: skip
        """A new session of `batch_size` rows, each starting with the first `tokens` tokens
        (default: all) of one-row `session` (a system prompt, computed once): the servers
        copy their caches (InferenceSession.fork). `generate(ids, session=forked)` then
        sends only what follows them in each row of `ids` (left-padded after them, with an
        attention_mask, where the rows' rests differ in length). The caller closes it."""
        source = self.cache_for(session)
        held = source.get_seq_length()
        tokens = held if tokens is None else tokens
        if not 0 < tokens <= held:
            raise ValueError(f"tokens={tokens}: the session holds {held} tokens")
        forked = session.fork(batch_size, session.max_length if max_length is None else max_length,
                              source.prefix_length + tokens)  # fmt: skip
        cache = self.cache_for(forked)
        cache.prefix_length = source.prefix_length
        if source.token_ids is not None:
            ids = source.token_ids[:, :tokens].expand(batch_size, -1)
            cache.record(ids, torch.ones_like(ids))
        return forked

    def cache_for(self, session: InferenceSession) -> RemoteCache:
        """The one RemoteCache standing for `session` (what generate(session=...) uses)."""
        with self._caches_lock:
            for key in [k for k, c in self._caches.items() if c.session.closed]:
                del self._caches[key]
            cache = self._caches.get(id(session))
            if cache is None or cache.session is not session:
                cache = self._caches[id(session)] = RemoteCache(session, owned=False)
            return cache


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
    what transformers gives: block 0's input, each block's output but the last, and the
    final normed state (the servers send the blocks' outputs only then; no gradient flows
    through them). The output's `past_key_values` (`cache`) is a RemoteCache to continue from.
    """

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None, inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None, position_ids: Any = None, use_cache: bool | None = None,
        return_dict: bool | None = None, output_hidden_states: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0, **kwargs: Any,
    ) -> Any:  # fmt: skip
        base = self.model(input_ids, attention_mask, cache=cache, inputs_embeds=inputs_embeds,
                          use_cache=use_cache, output_hidden_states=output_hidden_states,
                          output_attentions=kwargs.get("output_attentions"))  # fmt: skip
        normed = base.last_hidden_state  # [B, T, H]
        # generate() asks for the last position only: no [T, vocab] head over a whole prompt
        kept = normed if labels is not None else _kept(normed, logits_to_keep)
        logits = self.shared_head.project(kept)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        out = CausalLMOutputWithPast(loss=loss, logits=logits, cache=base.cache,
                                     hidden_states=base.hidden_states)  # fmt: skip
        return out.to_tuple() if return_dict is False else out

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
        room = 0
        if generation_mode == "assisted_generation":  # drafts are checked past max_length - 1
            # (prompt lookup's by up to prompt_lookup_num_tokens - 1): room for all of them
            room = 1 + (generation_config.prompt_lookup_num_tokens or 0)
        session = self.open_session(
            max_length=max_cache_length + prefix + room, batch_size=batch_size * beams
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
        that session stopped, and returns what you passed followed by the new tokens (as
        Petals does: `generate(None, ...)` gives the new tokens only); otherwise it opens its
        own sessions and closes them on return.
        """
        if inputs is None:
            inputs = kwargs.pop("input_ids", None)
        if session is not None:
            if kwargs.get("cache") is not None:
                raise ValueError("give generate() either session= or cache=, not both")
            active: RemoteCache | None = self.cache_for(session)
        else:
            active = self._calls.active if kwargs.get("cache") is None else None
        passed = 0 if inputs is None else inputs.shape[1]
        if active is not None:
            if active.session.position > 0:
                inputs, kwargs = active.resume_inputs(inputs, kwargs)
            kwargs["cache"] = active
        outer, self._calls.owned = self._calls.owned, []
        try:
            with threads(self.generate_threads), activated(kernel_in(self.head)):  # row kernel
                out = super().generate(inputs, *args, **kwargs)
        finally:
            owned, self._calls.owned = self._calls.owned, outer
            for cache in owned:  # the servers' replies to the close are not waited for
                cache.session.close(wait=False)
        if active is None:
            return out
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        active.last_sequences = sequences
        seen = 0 if inputs is None else inputs.shape[1]  # the session's tokens and yours
        if seen == passed:
            return out
        if isinstance(out, torch.Tensor):
            return sequences[:, seen - passed :]
        out.sequences = sequences[:, seen - passed :]
        return out


def _kept(hidden: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The positions transformers' `logits_to_keep` selects: last n (0 = all) or indices."""
    if isinstance(logits_to_keep, int):
        return hidden[:, -logits_to_keep:] if logits_to_keep > 0 else hidden
    return hidden[:, logits_to_keep]
