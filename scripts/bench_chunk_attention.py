"""A chunked prefill in one process: transformers' masked SDPA against drift.models.attention.

A span of `--blocks` of `--model` (float32) in one session takes a random `--tokens`-token
prompt in `--chunk`-token pieces (as a server's session does), first with the [T, past + T]
mask transformers builds ("sdpa"), then as DRIFT runs it ("drift_sdpa": no mask, the past
and the chunk apart), alternating `--reps` times; prints the medians, their ratio and the
largest difference of the outputs relative to their size. Threads: torch's default.

    PYTHONPATH=. .venv/bin/python scripts/bench_chunk_attention.py --tokens 4096 --chunk 512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import drift.models.adapters.llama as llama  # noqa: E402
from drift.models.attention import DRIFT_SDPA  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.span import ModelSpan  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--blocks", default="0:15")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    start, end = (int(x) for x in args.blocks.split(":"))
    span = ModelSpan.load(open_checkpoint(args.model), start, end, dtype=torch.float32)
    if span.adapter.attn_implementation != DRIFT_SDPA:
        raise SystemExit(f"{args.model}'s adapter does not run {DRIFT_SDPA}")
    x = torch.randn(1, args.tokens, int(span.config.hidden_size),
                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    after_past = llama.after_past

    def prefill(drift: bool) -> tuple[float, torch.Tensor]:
        span.adapter.config._attn_implementation = DRIFT_SDPA if drift else "sdpa"
        llama.after_past = after_past if drift else (lambda hidden, ctx: None)  # type: ignore[assignment]
        session = span.new_session(batch_size=1, max_length=args.tokens)
        outs = []
        started = time.perf_counter()
        with torch.no_grad():
            for a in range(0, args.tokens, args.chunk):
                outs.append(session.run(a, x[:, a : a + args.chunk])[0])
        return time.perf_counter() - started, torch.cat(outs, dim=1)

    prefill(True), prefill(False)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, torch.Tensor] = {}
    for _ in range(args.reps):
        for drift in (False, True):
            seconds, outs[drift] = prefill(drift)
            times[drift].append(seconds)
    llama.after_past = after_past
    span.adapter.config._attn_implementation = DRIFT_SDPA
    old, new = statistics.median(times[False]), statistics.median(times[True])
    diff = float((outs[True] - outs[False]).abs().max() / outs[False].abs().max())
    print(f"{args.model} blocks {args.blocks}, {args.tokens} tokens in {args.chunk}-token chunks, "
          f"{torch.get_num_threads()} threads: sdpa with mask {old:.2f} s, drift_sdpa {new:.2f} s "
          f"({new / old:.3f}x); runs {[round(t, 2) for t in times[False]]} / "
          f"{[round(t, 2) for t in times[True]]}; largest difference {diff:.1e} of the largest "
          "output")  # fmt: skip


if __name__ == "__main__":
    main()
