"""Per-token overhead of JSON-schema constrained decoding on SmolLM2's vocabulary.

For each grammar library (llguidance, xgrammar, outlines-core) this measures, on the
tokenizer of `drift.load_tokenizer("smollm2")` (49152 tokens):
  - setup: building the library's view of the tokenizer (once per process);
  - compile: turning one JSON schema into a matcher ready for its first mask (per request,
    unless cached); no library cache is used (xgrammar's is disabled);
  - mask: one decode step, i.e. compute the allowed-token bitmask, apply it to a [1, V]
    logits row (the same numpy unpack + masked_fill for every library), advance by one token.
Each schema's step loop walks the tokens of a valid JSON document; every token must be
accepted. The baseline is one SmolLM2 decode step of local `transformers` in the same run
(skip with --no_model), so the overhead is printed as a fraction of a decode step.
Settings run interleaved, --reps times; medians are printed. Needs
`pip install 'drift-swarm[bench-grammar]'` (libraries that are missing are skipped).

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_grammar.py --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "get_weather": (
        {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        {"city": "Paris"},
    ),
    "order": (
        {
            "type": "object",
            "properties": {
                "customer": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                            "quantity": {"type": "integer", "minimum": 1},
                            "price": {"type": "number"},
                        },
                        "required": ["sku", "quantity", "price"],
                        "additionalProperties": False,
                    },
                },
                "status": {"enum": ["new", "paid", "shipped"]},
                "gift": {"type": "boolean"},
            },
            "required": ["customer", "email", "items", "status", "gift"],
            "additionalProperties": False,
        },
        {
            "customer": "Ada Lovelace",
            "email": "ada@example.org",
            "items": [
                {"sku": "ABC-1234", "quantity": 2, "price": 9.5},
                {"sku": "XYZ-0042", "quantity": 1, "price": 120.25},
            ],
            "status": "paid",
            "gift": False,
        },
    ),
    "json_object": (
        {"type": "object"},
        {"answer": "The capital of France is Paris.", "confidence": 0.93, "sources": [1, 2]},
    ),
}
SEPARATORS = (", ", ": ")


def doc_ids(tokenizer: Any, instance: Any) -> list[int]:
    text = json.dumps(instance, separators=SEPARATORS)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE vocabularies spell tokens so)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = (b for b in range(256) if b not in keep)
    return {b: chr(b) for b in keep} | {b: chr(256 + n) for n, b in enumerate(extra)}


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The one mask application every library is timed with: bits -> bool -> -inf."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")
    allowed = torch.from_numpy(bits[: logits.shape[-1]]).bool()
    logits.masked_fill_(~allowed, float("-inf"))


class Lib:
    """One library behind three calls: setup(tokenizer), compile(schema), step(token)."""

    name = ""

    def setup(self, tokenizer: Any) -> None: ...
    def compile(self, schema: dict) -> Any: ...
    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None: ...
    def advance(self, matcher: Any, token: int) -> bool: ...


class LLGuidance(Lib):
    name = "llguidance"

    def setup(self, tokenizer: Any) -> None:
        import llguidance
        import llguidance.hf

        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(tokenizer)

    def compile(self, schema: dict) -> Any:
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, overrides={"whitespace_flexible": False, "item_separator": SEPARATORS[0],
                               "key_separator": SEPARATORS[1]},
        )  # fmt: skip
        matcher = self.ll.LLMatcher(self.tok, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))


class XGrammar(Lib):
    name = "xgrammar"

    def setup(self, tokenizer: Any) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: dict) -> Any:
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=SEPARATORS
        )
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(bitmask.view(1, -1))

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))


class OutlinesCore(Lib):
    name = "outlines-core"

    def setup(self, tokenizer: Any) -> None:
        import outlines_core

        self.oc = outlines_core
        decode = {c: b for b, c in byte_level_chars().items()}
        special = set(tokenizer.all_special_ids)
        words: dict[bytes, list[int]] = {}
        for token, i in tokenizer.get_vocab().items():
            if i not in special:
                words.setdefault(bytes(decode[c] for c in token), []).append(i)
        self.vocab = outlines_core.Vocabulary(tokenizer.eos_token_id, words)

    def compile(self, schema: dict) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(
            json.dumps(schema), whitespace_pattern=r"[ ]?"
        )
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def advance(self, matcher: Any, token: int) -> bool:
        matcher.advance(token)
        return True


LIBS: dict[str, Callable[[], Lib]] = {
    "llguidance": LLGuidance,
    "xgrammar": XGrammar,
    "outlines-core": OutlinesCore,
}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run_steps(
    lib: Lib, matcher: Any, ids: list[int], vocab: int
) -> tuple[list[float], list[float]]:
    """Seconds per decode step (mask + apply + advance), and of the mask alone, along `ids`;
    every token must be accepted."""
    bitmask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    logits = torch.zeros(1, vocab)
    times, fills = [], []
    for token in ids:
        start = time.perf_counter()
        lib.fill(matcher, bitmask)
        filled = time.perf_counter()
        apply_bitmask(logits, bitmask)
        ok = lib.advance(matcher, token)
        times.append(time.perf_counter() - start)
        fills.append(filled - start)
        assert ok and logits[0, token] == 0, f"{lib.name} refused token {token}"
        logits.zero_()
    return times, fills


def decode_step_s(reps: int) -> float:
    """Median seconds of one SmolLM2 decode step (local transformers, KV cache)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from drift.models.checkpoint import open_checkpoint

    path = open_checkpoint("smollm2").path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.arange(100, 132).unsqueeze(0)  # [1, 32]
    times = []
    with torch.inference_mode():
        for _ in range(reps):
            cache = DynamicCache(config=model.config)
            out = model(ids, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(16):
                t, out = timed(lambda t=token, c=cache: model(t, cache=c, use_cache=True))
                token = out.logits[:, -1:].argmax(-1)
                times.append(t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--libs", nargs="+", default=list(LIBS), choices=list(LIBS))
    parser.add_argument("--schemas", nargs="+", default=list(SCHEMAS), choices=list(SCHEMAS))
    parser.add_argument("--no_model", action="store_true", help="skip the decode-step baseline")
    args = parser.parse_args()

    from drift import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    vocab = len(tokenizer)
    libs, setup = [], {}
    for name in args.libs:
        lib = LIBS[name]()
        try:
            setup[name], _ = timed(lambda lib=lib: lib.setup(tokenizer))
        except ImportError as exc:
            print(f"{name}: not installed ({exc}); skipped")
            continue
        libs.append(lib)
    compile_s: dict[tuple[str, str], list[float]] = {}
    step_s: dict[tuple[str, str], list[float]] = {}
    fill_s: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.reps):  # interleaved: every (lib, schema) once per rep
        for schema_name in args.schemas:
            schema, instance = SCHEMAS[schema_name]
            ids = doc_ids(tokenizer, instance)
            for lib in libs:
                t, matcher = timed(lambda lib=lib, s=schema: lib.compile(s))
                compile_s.setdefault((lib.name, schema_name), []).append(t)
                steps, fills = run_steps(lib, matcher, ids, vocab)
                step_s.setdefault((lib.name, schema_name), []).extend(steps)
                fill_s.setdefault((lib.name, schema_name), []).extend(fills)
    base = None if args.no_model else decode_step_s(args.reps)
    print(f"vocabulary: {vocab} tokens (SmolLM2-135M-Instruct); {args.reps} reps, medians")
    if base is not None:
        print(f"baseline: one SmolLM2 decode step (local transformers) {base * 1e3:.2f} ms")
    for lib in libs:
        print(f"{lib.name}: tokenizer setup {setup[lib.name] * 1e3:.0f} ms (once per process)")
    print(f"{'library':14} {'schema':12} {'compile ms':>10} {'mask us':>8} {'step us':>8} "
          f"{'p90 us':>8} {'vs decode':>9}")  # fmt: skip
    for schema_name in args.schemas:
        for lib in libs:
            key = (lib.name, schema_name)
            step = statistics.median(step_s[key])
            p90 = statistics.quantiles(step_s[key], n=10)[-1]
            ratio = f"{step / base:9.3f}" if base else f"{'-':>9}"
            fill = statistics.median(fill_s[key])
            print(f"{lib.name:14} {schema_name:12} {statistics.median(compile_s[key]) * 1e3:10.2f} "
                  f"{fill * 1e6:8.1f} {step * 1e6:8.1f} {p90 * 1e6:8.1f} {ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
