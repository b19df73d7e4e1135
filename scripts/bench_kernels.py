"""One span's decode step: eager (the server's batched path) vs lean vs compiled, same weights.

A SmolLM2 span (default blocks 0:15; `--model gemma3-270m` and others too) takes a `--past`-token
prefill (default 64), then `--steps` decode steps of one token, through (1) drift.models.batch.run_steps, what a server runs with `--compile off`;
(2) the lean step (drift.models.static_step) uncompiled; (3) the lean step with DRIFT's row
kernel in its linears (drift.models.row_kernel: what a CPU server runs by default); (4) the
lean step compiled (drift.server.compiled, inductor; the compile time is printed). Prints ms per step, the ratios
to eager, and with `LLAMA_CPP=/path/to/llama-bench` (and `--gguf`) llama.cpp's ms per token
on the whole model for comparison. Torch threads: `--threads` (default 1, as a server's).
Then what bounds a step: the span's linear weights read as one-row products alone (each
`nn.Linear` once, in order: what a decode step of one session reads), through torch's BLAS and
through the row kernel, against a plain read of as many bytes from one buffer (what this
memory streams), all in ms and GB/s.

    PYTHONPATH=. .venv/bin/python scripts/bench_kernels.py --dtype float32 --blocks 0:15
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift.models.batch import BatchStep, run_steps  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.row_kernel import RowKernel, activated  # noqa: E402
from drift.models.rows import Product  # noqa: E402
from drift.models.span import ModelSpan  # noqa: E402
from drift.models.static_step import LeanDecoder  # noqa: E402
from drift.paths import resolve_cache_dir  # noqa: E402
from drift.server.compiled import DecodeUnit  # noqa: E402

Runner = Callable[[list[BatchStep]], list[torch.Tensor]]


def decode_ms(span: ModelSpan, run: Runner, steps: int, rows: int, past: int) -> float:
    """Mean ms per decode step over `steps` steps, `rows` sessions per step, `past`-token pasts."""
    hidden = int(span.config.hidden_size)
    gen = torch.Generator().manual_seed(0)
    sessions = [span.new_session(batch_size=1, max_length=past + steps + 1)
                for _ in range(rows)]  # fmt: skip
    for s in sessions:
        s.run(0, torch.randn(1, past, hidden, generator=gen).to(span.dtype))
    x = [torch.randn(1, 1, hidden, generator=gen).to(span.dtype) for _ in sessions]
    started = time.perf_counter()
    for i in range(steps):
        run([BatchStep(s, past + i, xi) for s, xi in zip(sessions, x, strict=True)])
    took = (time.perf_counter() - started) / steps * 1000
    for s in sessions:
        s.close()
    return took


def interleaved(variants: dict[str, tuple[ModelSpan, Runner]], steps: int, rows: int,
                reps: int, past: int) -> dict[str, float]:  # fmt: skip
    """Each variant once per rep, in turn (the machine is shared: the best rep of each)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, (span, run) in variants.items():
            times[name].append(decode_ms(span, run, steps, rows, past))
    return {name: min(t) for name, t in times.items()}


def best_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def memory_ms(span: ModelSpan, reps: int,
              kernel: RowKernel | None) -> tuple[float, float | None, float, int]:  # fmt: skip
    """(best ms of every linear layer's one-row product in the span, in layer order, through
    torch's BLAS; the same through `kernel`; best ms of a sum over one buffer of the same
    bytes; those bytes)."""
    weights = [m.weight for m in span.layers.modules() if isinstance(m, torch.nn.Linear)]
    size = sum(w.numel() * w.element_size() for w in weights)
    rows = {int(w.shape[1]): torch.randn(1, int(w.shape[1])).to(w.dtype) for w in weights}
    buffer = torch.ones(size // 4, dtype=torch.float32)

    def products(product: Product) -> Callable[[], None]:
        def one_pass() -> None:
            with torch.no_grad():
                for w in weights:
                    product(rows[int(w.shape[1])], w, None)

        return one_pass

    blas = best_ms(products(torch.nn.functional.linear), reps)
    mine = None if kernel is None else best_ms(products(kernel.linear), reps)
    return blas, mine, best_ms(buffer.sum, reps), size


def llama_cpp_ms(gguf: str | None) -> float | None:
    """llama.cpp's ms per generated token (llama-bench -n 32 -p 0), when LLAMA_CPP is set."""
    binary = os.environ.get("LLAMA_CPP")
    if not binary or not gguf:
        return None
    out = subprocess.run([binary, "-m", gguf, "-p", "0", "-n", "32", "-t", "2", "-o", "csv"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    rate = float(re.findall(r"([\d.]+),[\d.]+\s*$", out.strip(), re.M)[-1])
    return 1000 / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--blocks", default="0:15")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1, help="sessions stepping together")
    parser.add_argument("--past", type=int, default=64, help="tokens each session holds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also the compiled lean step (inductor: ~40 s to compile here)",
    )
    parser.add_argument("--gguf", default=None, help="the GGUF llama-bench reads (LLAMA_CPP)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    start, end = (int(b) for b in args.blocks.split(":"))
    span = ModelSpan.load(open_checkpoint(args.model), start, end, dtype=dtype)
    print(f"{args.model} blocks {start}:{end} {args.dtype}, {args.past}-token past, "
          f"{args.rows} session(s) per step, {args.threads} thread(s)")  # fmt: skip
    relaid = ModelSpan.load(open_checkpoint(args.model), start, end, dtype=dtype)
    unit = DecodeUnit(relaid, compiled=False)  # the lean step, float32 weights stored [in, out]
    variants: dict[str, tuple[ModelSpan, Runner]] = {
        "eager": (span, run_steps),
        "lean": (span, LeanDecoder(span).run),  # the lean step on the weights as loaded
    }
    if unit.relaid:
        variants["lean+layout"] = (relaid, unit.run)
    kernel, why = RowKernel.build(resolve_cache_dir(None))
    print(f"row kernel: {why}")
    if kernel is not None:
        kernelled = ModelSpan.load(open_checkpoint(args.model), start, end, dtype=dtype)
        if kernel.install(kernelled.layers):
            lean = LeanDecoder(kernelled)

            def on_kernel(steps: list[BatchStep]) -> list[torch.Tensor]:
                with activated(kernel):  # as a server's session steps run
                    return lean.run(steps)

            variants["lean+kernel"] = (kernelled, on_kernel)
    if args.compile:
        compiled = DecodeUnit(relaid, compiled=True)
        status = compiled.warm_up()
        print(f"compile + warm-up: {status.compile_s:.1f} s")
        variants["compiled"] = (relaid, compiled.run)
    results = interleaved(variants, args.steps, args.rows, args.reps, args.past)
    ref = llama_cpp_ms(args.gguf)
    for name, ms in results.items():
        print(f"{name:>12}: {ms:7.2f} ms/step  x{results['eager'] / ms:.2f} vs eager")
    products, mine, read, size = memory_ms(span, max(args.reps, 3) * 2, kernel)
    print(f"the span's linear weights, {size / 1e6:.0f} MB: one-row products alone "
          f"{products:.2f} ms ({size / products / 1e6:.1f} GB/s, "
          f"{products / results['lean'] * 100:.0f}% of a lean step); a plain read of as many "
          f"bytes {read:.2f} ms ({size / read / 1e6:.1f} GB/s)")  # fmt: skip
    if mine is not None:
        print(f"the same products on the row kernel: {mine:.2f} ms ({size / mine / 1e6:.1f} "
              f"GB/s, {mine / results['lean+kernel'] * 100:.0f}% of a lean+kernel step)")  # fmt: skip
    if ref is not None:
        blocks = int(span.config.num_hidden_layers)
        share = ref * (end - start) / blocks
        print(f"llama.cpp: {ref:.2f} ms/token whole model, ~{share:.2f} ms for these blocks; "
              f"best here x{min(results.values()) / share:.2f} of it")  # fmt: skip


if __name__ == "__main__":
    main()
