"""Fault injection for client tests: run an action (kill a server) at a given generation step."""

from __future__ import annotations

from collections.abc import Callable

from transformers import LogitsProcessor


class AtStep(LogitsProcessor):
    """Calls `action` when generation reaches its `at`-th step (pass it in logits_processor)."""

    def __init__(self, at: int, action: Callable[[], None]) -> None:
        self.calls, self.at, self.action = 0, at, action

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.at:
            self.action()
        return scores
