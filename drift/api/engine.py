"""The narrow engine the API drives: a transformers-compatible causal LM plus its tokenizer.

`CausalLMEngine` works the same on a local `AutoModelForCausalLM` and on DRIFT's
`AutoDistributedModelForCausalLM`: it only calls `generate()` with logits processors (a
grammar's among them) and a stopping criterion, and reports each new token through a
callback; `embed` pools the final hidden states of a forward pass. Blocking (run it on an
executor); it knows nothing of HTTP or asyncio. A `sessions` factory gives each generation
its own sessions and tells which servers ran it. `generate_batch` runs several requests as
one left-padded batch (per-row processors, per-row stop: `on_done` the step a row ends).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from drift.api.grammar import Grammar, GrammarCompiler
from drift.api.messages import ChatMessage, ToolSpec
from drift.api.prompt import ChatTemplate
from drift.api.sampling import (
    BatchTap,
    LogprobRecorder,
    PenaltyProcessor,
    RowProcessors,
    SeededSampler,
    TokenTap,
)
from drift.wire.errors import LengthExceeded


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    temperature: float  # 0 = greedy
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int | None  # None = no log-probs; k = chosen token plus k alternatives
    grammar: Grammar | None = None  # constrained decoding (response_format, tools)
    adapter: str | None = None  # a LoRA adapter the swarm serves ("model:adapter" ids)


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    logprob: float | None  # log-probability under the model (None when not asked)
    top: tuple[tuple[int, float], ...]  # best alternatives (token id, log-prob)


RouteCallback = Callable[[tuple["ServedSpan", ...]], None]


@dataclass(frozen=True)
class BatchRow:
    """One request of a batch: what `generate` takes, plus `on_done` (called once)."""

    prompt_ids: Sequence[int]
    params: GenerationParams
    generator: torch.Generator
    on_token: Callable[[TokenEvent], None]
    cancel: threading.Event
    on_done: Callable[..., None]  # on_done() when the row ends; on_done(exc) on failure
    on_route: RouteCallback | None = None  # told once which servers run the row


@dataclass(frozen=True)
class ServedSpan:
    """Blocks [start_block, end_block) of a generation ran on this server."""

    peer_id: str
    addr: str
    start_block: int
    end_block: int


@dataclass(frozen=True)
class OpenedSessions:
    generate_kwargs: dict[str, Any]  # extra generate() arguments (e.g. {"session": s})
    route: Callable[[], tuple[ServedSpan, ...]]  # the servers in use (after the first step)


# (max_length, batch_size, LoRA adapter or None, each row's prompt ids or None) -> a context
# manager holding one generation's sessions (a lone row's maybe continuing a held one, a
# group's maybe forked from one: drift.api.prefix); prompts None: nothing is reused
SessionFactory = Callable[[int, int, str | None, Sequence[Sequence[int]] | None],
                          AbstractContextManager[OpenedSessions]]  # fmt: skip
Pooling = str  # "mean": mean of the final normed hidden states over the tokens, then L2 norm


class CausalLMEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        context_length: int | None = None,
        sessions: SessionFactory | None = None,
        adapters: Callable[[], tuple[str, ...]] | None = None,
    ) -> None:
        self.model = model
        self.sessions = sessions
        # the LoRA adapters requests may name ("model:adapter"): those the swarm serves now
        # (may block: the service calls it off the event loop)
        self.adapters = adapters or (lambda: ())
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.template = ChatTemplate(tokenizer, model_id)
        config = model.config
        self.context_length = int(
            context_length
            or getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None)
            or 2048
        )
        eos: set[int] = set()
        for source in (
            tokenizer.eos_token_id,
            getattr(model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, (list, tuple)):
                eos.update(int(t) for t in source)
        self.eos_token_ids = frozenset(eos)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (min(eos) if eos else 0)
        self.grammars = GrammarCompiler(tokenizer, self.eos_token_ids)
        self.hidden_size = int(getattr(config, "hidden_size", 0) or 0)

    # -- text <-> ids -------------------------------------------------------------------
    def chat_prompt(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> list[int]:
        text = self.template.render(messages, tools)
        self.refuse_unfittable(text, "messages")
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str, param: str = "prompt") -> list[int]:
        self.refuse_unfittable(text, param)
        return list(self.tokenizer(text)["input_ids"])

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for: the vocabulary's longest entry (a
        byte-level token's characters are its bytes)."""
        return max((len(t) for t in self.tokenizer.get_vocab()), default=1) or 1

    def refuse_unfittable(self, text: str, param: str) -> None:
        """LengthExceeded, before any tokenizing, for a text that cannot fit the context
        whatever its tokens: it needs at least len / max_token_chars of them (halved again
        for normalisation). A 7 MiB body costs a tokenizer seconds of CPU and ~0.5 GB."""
        least = len(text) // (2 * self.max_token_chars)
        if least > self.context_length:
            raise LengthExceeded(
                f"this model's maximum context length is {self.context_length} tokens; the "
                f"prompt is {len(text)} characters, at least {least} tokens. Shorten it.",
                param=param,
            )

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    # -- embeddings ---------------------------------------------------------------------
    pooling = "mean"  # see `embed`; stated in the model card of /v1/models

    def embed(self, input_ids: Sequence[int]) -> list[float]:
        """One input's embedding: the mean over its tokens of the model's final normed hidden
        state, L2-normalised. Inputs run one at a time, so an embedding never depends on
        what else was in the request (batching or padding would change the last bits)."""
        ids = torch.tensor([list(input_ids)], dtype=torch.long)  # [1, T]
        with torch.inference_mode():  # the base model: no head, no per-layer states
            out = self.model.base_model(ids, use_cache=False)
        pooled = out.last_hidden_state[0].float().mean(dim=0)  # [H]
        return torch.nn.functional.normalize(pooled, dim=-1).tolist()

    # -- generation ---------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        generator: torch.Generator,
        on_token: Callable[[TokenEvent], None],
        cancel: threading.Event,
        on_route: RouteCallback | None = None,
    ) -> None:
        """Generate one choice, calling `on_token` for every new token (EOS included)."""
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # [1, P]
        processors, recorder = self.processors(len(prompt_ids), params, generator)
        with (
            torch.inference_mode(),
            self._open(
                len(prompt_ids) + params.max_new_tokens, 1, params.adapter, [prompt_ids]
            ) as opened,
        ):
            routed = _Once(opened.route, [on_route] if on_route else [])

            def tap(token_id: int) -> None:
                routed()
                on_token(self.event(token_id, recorder, params.top_logprobs))

            self._generate(input_ids, torch.ones_like(input_ids), params.max_new_tokens,
                           processors, TokenTap(tap, cancel), opened.generate_kwargs)  # fmt: skip

    def _open(self, max_length: int, batch_size: int, adapter: str | None,
              prompts: Sequence[Sequence[int]] | None,
              ) -> AbstractContextManager[OpenedSessions]:  # fmt: skip
        if self.sessions is None:
            return contextlib.nullcontext(OpenedSessions({}, lambda: ()))
        return self.sessions(max_length, batch_size, adapter, prompts)

    def generate_batch(self, rows: Sequence[BatchRow]) -> None:
        """Generate several requests (of one LoRA adapter, or none) as one left-padded batch;
        each row stops on its own (EOS, its max_new_tokens, its cancel) and gets `on_done` at
        that step."""
        width = max(len(r.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, W]
        row_processors, taps = [], []
        for i, row in enumerate(rows):
            n = len(row.prompt_ids)
            input_ids[i, width - n :] = torch.tensor(list(row.prompt_ids), dtype=torch.long)
            mask[i, width - n :] = 1
            procs, recorder = self.processors(width, row.params, row.generator)
            row_processors.append(procs)
            taps.append(self._row_tap(row, recorder))
        stop = BatchTap(taps, [r.params.max_new_tokens for r in rows],
                        [r.cancel for r in rows], [r.on_done for r in rows],
                        self.eos_token_ids)  # fmt: skip
        max_new = max(r.params.max_new_tokens for r in rows)
        adapter = rows[0].params.adapter
        lone = [rows[0].prompt_ids] if len(rows) == 1 else None  # may continue a session
        with (
            torch.inference_mode(),
            self._open(width + max_new, len(rows), adapter, lone) as opened,
        ):
            stop.before_step = _Once(opened.route, [r.on_route for r in rows if r.on_route])
            self._generate(input_ids, mask, max_new, LogitsProcessorList([RowProcessors(
                row_processors)]), stop, opened.generate_kwargs)  # fmt: skip
        stop.finish_all()

    # -- one row at a time (drift.api.continuous runs the rows together) ----------------
    def open_group(self, prompts: Sequence[Sequence[int]], params: Sequence[GenerationParams],
                   ) -> AbstractContextManager[OpenedSessions]:  # fmt: skip
        """Sessions for requests (of one adapter) run as one left-padded batch; a lone one's
        may continue a held session sharing its prefix, a group's start from one sharing
        the prefix of all its prompts (`held_tokens` says how many tokens they hold)."""
        width = max(len(p) for p in prompts)
        return self._open(width + max(p.max_new_tokens for p in params), len(prompts),
                          params[0].adapter, prompts)  # fmt: skip

    def held_tokens(self, opened: OpenedSessions) -> int:
        """Tokens the rows' sessions already hold (the prompts' shared prefix: a continued
        or forked session's), the same in every row."""
        session = opened.generate_kwargs.get("session")
        return 0 if session is None else int(session.position)

    def row_step(self, opened: OpenedSessions, ids: torch.Tensor,
                 mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """New tokens [B, T] through a group's sessions (`mask` [B, past + T] as generate()
        passes it; None: no padding): the final normed states of the last position [B, H]
        (the head is `project`'s, for all groups at once)."""
        cache = self.model.cache_for(opened.generate_kwargs["session"])
        out = self.model.model(ids, attention_mask=mask, cache=cache, use_cache=True)
        return out.last_hidden_state[:, -1]  # [B, H]

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """Final normed states [B, H] -> logits [B, V] (one head computation)."""
        return self.model.head.project(normed)

    def _row_tap(self, row: BatchRow, recorder: LogprobRecorder | None) -> Callable[[int], None]:
        def tap(token_id: int) -> None:
            row.on_token(self.event(token_id, recorder, row.params.top_logprobs))

        return tap

    def processors(
        self, prompt_length: int, params: GenerationParams, generator: torch.Generator
    ) -> tuple[LogitsProcessorList, LogprobRecorder | None]:
        processors = LogitsProcessorList()
        recorder = LogprobRecorder() if params.top_logprobs is not None else None
        if recorder is not None:
            processors.append(recorder)
        if params.presence_penalty or params.frequency_penalty:
            processors.append(
                PenaltyProcessor(prompt_length, params.presence_penalty, params.frequency_penalty)
            )
        if params.grammar is not None:  # after the penalties, before drawing a token
            processors.append(params.grammar.processor())
        if params.temperature > 0:
            processors.append(SeededSampler(params.temperature, params.top_p, generator))
        return processors, recorder

    def _generate(self, input_ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
                  processors: LogitsProcessorList, stop: Any, extra: dict) -> None:  # fmt: skip
        self.model.generate(
            input_ids,
            **extra,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,  # sampling, when asked, is SeededSampler's job
            num_beams=1,
            eos_token_id=sorted(self.eos_token_ids) or None,
            pad_token_id=self.pad_token_id,
            logits_processor=processors,
            stopping_criteria=StoppingCriteriaList([stop]),
        )

    @staticmethod
    def event(token_id: int, recorder: LogprobRecorder | None, k: int | None) -> TokenEvent:
        if recorder is None or recorder.last is None:
            return TokenEvent(token_id, None, ())
        logprobs = recorder.last  # [V]
        top: tuple[tuple[int, float], ...] = ()
        if k:
            values, indices = logprobs.topk(k)
            top = tuple(zip(indices.tolist(), values.tolist(), strict=True))
        return TokenEvent(token_id, float(logprobs[token_id]), top)


class _Once:
    """Tell `callbacks` the route the first time it is called (after the first step)."""

    def __init__(self, route: Callable[[], tuple[ServedSpan, ...]],
                 callbacks: list[RouteCallback]) -> None:  # fmt: skip
        self.route = route
        self.callbacks = callbacks

    def __call__(self) -> None:
        if self.callbacks:
            route = self.route()
            for callback in self.callbacks:
                callback(route)
            self.callbacks = []
