"""OpenAI response bodies: completions, chat completions, stream chunks, log-probs, errors.

Pure functions from DRIFT's results (`Delta`, `Finish`, `TokenEvent`) to the JSON shapes
the official `openai` client parses. Knows no HTTP and no model; `token_text` turns ids
into strings.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from drift.api.engine import TokenEvent
from drift.api.service import Delta, Finish
from drift.wire.errors import DriftError

TokenText = Callable[[int], str]

# drift error code -> OpenAI error code (where OpenAI has a well-known one)
_OPENAI_CODES = {
    "length_exceeded": "context_length_exceeded",
    "unauthorized": "invalid_api_key",
    "not_found": "model_not_found",
    "busy": "rate_limit_exceeded",
}


def error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict:
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def drift_error_body(exc: DriftError) -> dict:
    param = exc.details.get("param")
    code = _OPENAI_CODES.get(exc.code, exc.code)
    return error_body(exc.status, exc.message, code, param if isinstance(param, str) else None)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_logprobs(
    tokens: Sequence[TokenEvent], token_text: TokenText, offset: int
) -> dict[str, Any]:
    """The legacy completions `logprobs` object; `offset` is where the first token starts."""
    out: dict[str, Any] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for event in tokens:
        text = token_text(event.token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(event.logprob)
        out["top_logprobs"].append({token_text(t): lp for t, lp in event.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _entry(token_text: TokenText, token_id: int, logprob: float | None) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokens: Sequence[TokenEvent], token_text: TokenText) -> dict[str, Any]:
    content = []
    for event in tokens:
        entry = _entry(token_text, event.token_id, event.logprob)
        entry["top_logprobs"] = [_entry(token_text, t, lp) for t, lp in event.top]
        content.append(entry)
    return {"content": content}


def model_card(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "drift"}


class ResponseBuilder:
    """Accumulates one request's events into a response body, or renders them as chunks."""

    def __init__(
        self,
        *,
        chat: bool,
        model: str,
        created: int,
        token_text: TokenText,
        prompt_tokens: int,
        echo: Sequence[str],  # per choice: text to put before the completion ("" = none)
        logprobs: bool,
    ) -> None:
        self.chat = chat
        self.model = model
        self.created = created
        self.token_text = token_text
        self.prompt_tokens = prompt_tokens
        self.echo = list(echo)
        self.logprobs = logprobs
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.texts = ["" for _ in self.echo]
        self.tokens: list[list[TokenEvent]] = [[] for _ in self.echo]
        self.finish: list[str | None] = [None for _ in self.echo]
        self.completion_tokens = 0
        self._started = [False for _ in self.echo]

    # -- non-streaming ------------------------------------------------------------------
    def add(self, event: Delta | Finish) -> None:
        if isinstance(event, Delta):
            self.texts[event.index] += event.text
            self.tokens[event.index].extend(event.tokens)
        else:
            self.finish[event.index] = event.reason
            self.completion_tokens += event.completion_tokens

    def body(self) -> dict[str, Any]:
        choices = []
        for i, text in enumerate(self.texts):
            lp = self._logprobs(i, self.tokens[i], len(self.echo[i])) if self.logprobs else None
            choice: dict[str, Any] = {"index": i, "logprobs": lp, "finish_reason": self.finish[i]}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = self.echo[i] + text
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
            "usage": usage(self.prompt_tokens, self.completion_tokens),
        }

    # -- streaming ----------------------------------------------------------------------
    def chunk(self, event: Delta | Finish) -> dict[str, Any] | None:
        """One stream chunk for this event (None when there is nothing to say)."""
        i = event.index
        first = not self._started[i]
        self._started[i] = True
        text = event.text if isinstance(event, Delta) else ""
        tokens = event.tokens if isinstance(event, Delta) else ()
        offset = len(self.echo[i]) + len(self.texts[i])
        if isinstance(event, Delta):
            self.texts[i] += event.text
        else:
            self.completion_tokens += event.completion_tokens
        finish = event.reason if isinstance(event, Finish) else None
        if not text and not tokens and finish is None and not first:
            return None
        lp = self._logprobs(i, tokens, offset) if self.logprobs and tokens else None
        choice: dict[str, Any] = {"index": i, "logprobs": lp, "finish_reason": finish}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or first:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = (self.echo[i] if first else "") + text
        return self._envelope([choice])

    def usage_chunk(self) -> dict[str, Any]:
        out = self._envelope([])
        out["usage"] = usage(self.prompt_tokens, self.completion_tokens)
        return out

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def _logprobs(self, i: int, tokens: Sequence[TokenEvent], offset: int) -> dict[str, Any]:
        if self.chat:
            return chat_logprobs(tokens, self.token_text)
        return completion_logprobs(tokens, self.token_text, offset)
