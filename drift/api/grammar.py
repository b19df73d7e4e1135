"""Constrained decoding with llguidance: grammars compiled per request, one mask per token.

`GrammarCompiler` builds llguidance's view of a tokenizer once (~0.3 s for SmolLM2's 49k
tokens) and checks Lark grammars (JSON schemas enter through `%json`); `Grammar.processor()`
gives a fresh `GrammarProcessor`, a transformers LogitsProcessor that advances its matcher by
the tokens generate() chose and sets every token the grammar forbids to -inf (EOS once the
grammar is complete). Knows no HTTP and no OpenAI shapes. Why llguidance: see
scripts/bench_grammar.py and the README (sub-millisecond compiles, ~10-40 us masks).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from drift.wire.errors import BadRequest

log = logging.getLogger(__name__)

# Compact JSON (", " and ": ", no free whitespace): what models see in their training data,
# and no room for runaway whitespace. Schemas may override it with their own "x-guidance".
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 256  # compiled grammars kept (by text)
INSTALL_HINT = "pip install 'drift-swarm[api]'"


def json_value(schema: dict[str, Any]) -> str:
    """A Lark right-hand side for one JSON value valid under `schema` (compact style)."""
    return "%json " + json.dumps({"x-guidance": JSON_STYLE, **schema})


def quoted(text: str) -> str:
    """A Lark string literal matching `text` exactly."""
    return json.dumps(text)


class Grammar:
    """A checked grammar; `processor()` makes the per-choice logits processor."""

    def __init__(self, compiler: GrammarCompiler, text: str) -> None:
        self.compiler = compiler
        self.text = text

    def processor(self) -> GrammarProcessor:
        ll = self.compiler.ll
        matcher = ll.LLMatcher(self.compiler.tokenizer, self.text, log_level=0)
        if matcher.is_error():  # checked when compiled: a bug if it happens here
            raise RuntimeError(f"grammar failed to load: {matcher.get_error()}")
        return GrammarProcessor(matcher, self.compiler.vocab_size)


class GrammarCompiler:
    """llguidance's tokenizer (built on first use) plus a small cache of checked grammars."""

    def __init__(self, tokenizer: Any, eos_token_ids: Collection[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._tokenizer: Any = None
        self.ll: Any = None
        self.vocab_size = 0

    @staticmethod
    def available() -> bool:
        try:
            import llguidance  # noqa: F401
        except ImportError:
            return False
        return True

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                try:
                    import llguidance
                    import llguidance.hf
                except ImportError as exc:
                    raise BadRequest(
                        f"constrained decoding needs the llguidance package: {INSTALL_HINT}"
                    ) from exc
                self.ll = llguidance
                self._tokenizer = self._ll_tokenizer()
                self.vocab_size = int(self._tokenizer.vocab_size)
            return self._tokenizer

    def _ll_tokenizer(self) -> Any:
        eos = self._eos[0] if len(self._eos) == 1 else (self._eos or None)
        try:  # the fast path: llguidance reads the tokenizers JSON itself
            return self.ll.hf.from_tokenizer(self._hf_tokenizer, eos_token=eos)
        except ValueError:  # a decoder it does not know: hand it every token's bytes
            return self.ll.LLTokenizer(self.ll.TokenizerWrapper(_ByteTokens(self._hf_tokenizer)),
                                       eos_token=eos)  # fmt: skip

    def compile(self, lark: str, *, param: str) -> Grammar:
        """Check `lark` once (cached by text); BadRequest naming `param` if it is invalid."""
        tokenizer = self.tokenizer
        with self._lock:
            grammar = self._cache.get(lark)
            if grammar is not None:
                self._cache.move_to_end(lark)
                return grammar
        text = self.ll.LLMatcher.grammar_from_lark(lark)
        error, messages = self.ll.LLMatcher.validate_grammar_with_warnings(text, tokenizer)
        if error:
            raise BadRequest(f"invalid schema or grammar: {messages[0]}", param=param)
        grammar = Grammar(self, text)
        with self._lock:
            self._cache[lark] = grammar
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar


class _ByteTokens:
    """What llguidance's TokenizerWrapper reads: each token's bytes, and an encoder."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = list(tokenizer.all_special_ids)
        self.tokens = [tokenizer.decode([i]).encode() for i in range(len(tokenizer))]

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class GrammarProcessor(LogitsProcessor):
    """One choice's matcher: consume what was generated since the last call, mask the rest.

    The first call sees only the prompt; later calls consume the new tokens. Once the grammar
    has stopped (its EOS consumed, or a batch row kept running after its end) it no longer
    masks: that row's tokens are discarded by the caller.
    """

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # tokens the grammar knows; logits may be wider
        self.bitmask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        self.seen: int | None = None  # input width at the previous call
        self.active = True

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        width = input_ids.shape[1]
        new = [] if self.seen is None else input_ids[0, self.seen :].tolist()
        self.seen = width
        if not self.active:
            return scores
        for token in new:
            if self.matcher.is_stopped() or not self.matcher.consume_token(int(token)):
                self.active = False  # the row ended (EOS / padding after it)
                return scores
        m = self.matcher
        m.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        bits = np.unpackbits(self.bitmask.numpy().view(np.uint8), bitorder="little")
        allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)  # [V]
        n = min(self.vocab_size, scores.shape[-1])
        allowed[:n] = torch.from_numpy(bits[:n].astype(bool))
        return scores.masked_fill(~allowed, float("-inf"))
