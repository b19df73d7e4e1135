"""What a pause costs the next step on this machine: local transformers, no DRIFT.

A swarm is a pipeline: while one server computes, the others (and the client) wait, so
every server starts each step after an idle pause (the rest of the chain's compute), while
local transformers runs its blocks back to back in one process. This times the same
forward of `--blocks` of `--model` (float32, one session's cache, torch's default threads)
back to back and after each pause in `--pauses` (ms, the process sleeping), interleaved
`--reps` times, for `--tokens` new tokens per step (1: a decode step; 5: bench_client's
prompt). The ratios say how much slower a step starts after such a pause here: caches and
TLB refilled, threads woken, and on a VM the vCPU rescheduled. That part of a swarm's gap
to local is the machine's, not the protocol's.

    PYTHONPATH=. .venv/bin/python scripts/bench_wake.py --tokens 1,5 --pauses 30,200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift.models.checkpoint import open_checkpoint  # noqa: E402


def step_seconds(model: torch.nn.Module, blocks: range, tokens: int, past: int) -> float:
    """One forward of `tokens` new tokens after a cached `past` through `blocks`."""
    inner = model.model  # type: ignore[attr-defined]
    width = model.config.hidden_size  # type: ignore[attr-defined]
    with torch.no_grad():
        cache = DynamicCache(config=model.config)  # type: ignore[attr-defined]
        layers = [inner.layers[i] for i in blocks]
        for length, timed in ((past, False), (tokens, True)):
            if not length:
                continue
            start = cache.get_seq_length()
            h = torch.randn(1, length, width)
            pos = torch.arange(start, start + length)[None]
            began = time.perf_counter()
            emb = inner.rotary_emb(h, pos)
            for layer in layers:
                h = layer(h, attention_mask=None, position_embeddings=emb, past_key_values=cache,
                          position_ids=pos, use_cache=True)  # fmt: skip
                h = h[0] if isinstance(h, tuple) else h
            if timed:
                return time.perf_counter() - began
    raise AssertionError("no timed step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--blocks", default="0:15")
    parser.add_argument("--tokens", default="1,5", help="new tokens per step, e.g. 1,5")
    parser.add_argument("--pauses", default="30,200", help="idle ms before a step, e.g. 30,200")
    parser.add_argument("--past", type=int, default=0, help="tokens cached before the step")
    parser.add_argument("--reps", type=int, default=12)
    args = parser.parse_args()
    start, end = (int(x) for x in args.blocks.split(":"))
    model = AutoModelForCausalLM.from_pretrained(
        open_checkpoint(args.model).path, dtype=torch.float32
    ).eval()
    blocks = range(start, end)
    pauses = [0.0] + [float(p) / 1e3 for p in args.pauses.split(",")]
    print(f"{args.model} blocks {start}:{end}, float32, {torch.get_num_threads()} threads, "
          f"past {args.past}, medians of {args.reps}")  # fmt: skip
    for tokens in (int(t) for t in args.tokens.split(",")):
        times: dict[float, list[float]] = {p: [] for p in pauses}
        for _ in range(3):
            step_seconds(model, blocks, tokens, args.past)  # warm up
        for _ in range(args.reps):
            for pause in pauses:
                if pause:
                    time.sleep(pause)
                else:
                    step_seconds(model, blocks, tokens, args.past)  # keep it hot
                times[pause].append(step_seconds(model, blocks, tokens, args.past))
        hot = statistics.median(times[0.0])
        cells = [f"back to back {hot * 1e3:.2f} ms"] + [
            f"after {p * 1e3:.0f} ms idle {statistics.median(times[p]) * 1e3:.2f} ms "
            f"({statistics.median(times[p]) / hot:.2f}x)"
            for p in pauses[1:]
        ]
        print(f"{tokens} new token(s): " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
