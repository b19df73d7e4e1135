"""Logits processors and a stopping criterion that let `generate()` serve OpenAI requests.

- `LogprobRecorder` keeps the model's log-probabilities of the latest step (raw logits).
- `PenaltyProcessor` applies OpenAI's presence / frequency penalties to generated tokens.
- `SeededSampler` does temperature + top-p sampling with its own `torch.Generator` (no
  global RNG, so concurrent seeded requests stay reproducible) and leaves only the drawn
  token finite, so greedy selection in `generate()` picks it.
- `TokenTap` sees each new token, reports it, and stops generation when cancelled.
- `RowProcessors` / `BatchTap`: the same per row of a batch of separate requests.
Plain torch + transformers; no I/O, no asyncio.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence

import torch
from transformers import LogitsProcessor, StoppingCriteria


class LogprobRecorder(LogitsProcessor):
    def __init__(self) -> None:
        self.last: torch.Tensor | None = None  # [V] log-probs of the latest step (row 0)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.last = torch.log_softmax(scores[0].float(), dim=-1)
        return scores


class PenaltyProcessor(LogitsProcessor):
    def __init__(self, prompt_length: int, presence: float, frequency: float) -> None:
        self.prompt_length = prompt_length
        self.presence = presence
        self.frequency = frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_length :]  # [B, T_new]
        if generated.shape[1] == 0:
            return scores
        counts = torch.zeros_like(scores)  # [B, V]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


class SeededSampler(LogitsProcessor):
    def __init__(self, temperature: float, top_p: float, generator: torch.Generator) -> None:
        assert temperature > 0
        self.temperature = temperature
        self.top_p = top_p
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)  # [B, V]
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass ahead of each token
            sorted_probs = sorted_probs.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
        drawn = torch.multinomial(probs, 1, generator=self.generator)  # [B, 1]
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, drawn, 0.0)


class TokenTap(StoppingCriteria):
    """Called by `generate()` after every new token: report it; stop when cancelled."""

    def __init__(self, on_token: Callable[[int], None], cancel: threading.Event) -> None:
        self.on_token = on_token
        self.cancel = cancel

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.on_token(int(input_ids[0, -1]))
        stop = self.cancel.is_set()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class RowProcessors(LogitsProcessor):
    """Row i's scores go through row i's own processors (a batch of separate requests)."""

    def __init__(self, rows: Sequence[Callable[..., torch.Tensor]]) -> None:
        self.rows = list(rows)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = [procs(input_ids[i : i + 1], scores[i : i + 1]) for i, procs in enumerate(self.rows)]
        return torch.cat(out, dim=0)


class BatchTap(StoppingCriteria):
    """Per row of a batch: report each new token until the row ends (EOS, its own token
    budget, or cancelled), then call its `on_done` at once; stop when every row has."""

    def __init__(
        self, taps: Sequence[Callable[[int], None]], budgets: Sequence[int],
        cancels: Sequence[threading.Event], on_done: Sequence[Callable[[], None]],
        eos: Collection[int],
    ) -> None:  # fmt: skip
        self.taps, self.budgets, self.cancels = list(taps), list(budgets), list(cancels)
        self.on_done = list(on_done)
        self.eos = eos
        self.counts = [0] * len(self.taps)
        self.done = [False] * len(self.taps)
        self.before_step: Callable[[], None] | None = None  # called before each step's taps

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self.before_step is not None:
            self.before_step()
        for i, tap in enumerate(self.taps):
            if self.done[i]:
                continue
            token = int(input_ids[i, -1])
            tap(token)
            self.counts[i] += 1
            if token in self.eos or self.counts[i] >= self.budgets[i] or self.cancels[i].is_set():
                self._finish(i)
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)

    def _finish(self, i: int) -> None:
        self.done[i] = True
        self.on_done[i]()

    def finish_all(self) -> None:
        """After generate() returned: end the rows still open."""
        for i in range(len(self.taps)):
            if not self.done[i]:
                self._finish(i)
