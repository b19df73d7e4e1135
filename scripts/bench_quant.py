"""Speed and error of quantized spans against float32, and of the CPU paths DRIFT picked.

Loads the same blocks (real SmolLM2 by default) as float32, int8 and nf4 spans, plus two
alternatives it did not pick: int8 through LLM.int8 (activations quantized too) and nf4
through bitsandbytes' AVX512-BF16 repacked kernel. Times a decode step (1 token) and a
prefill (16 tokens) of each, interleaved, several reps, and prints medians as ratios to
float32, with the relative error of each variant's span output against float32's.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_quant.py --blocks 0:10 --reps 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.quant import Int8Linear  # noqa: E402
from drift.models.span import ModelSpan  # noqa: E402


def llm_int8(span: ModelSpan) -> ModelSpan:
    """int8 modules forced onto bitsandbytes' int8 matmul (what DRIFT uses on CUDA)."""
    for module in span.modules():
        if isinstance(module, Int8Linear):
            inner = module.inner

            def forward(x: torch.Tensor, inner: torch.nn.Module = inner) -> torch.Tensor:
                inner.training = False
                out = inner(x.reshape(-1, x.shape[-1]))
                return out.reshape(*x.shape[:-1], out.shape[-1])

            module.forward = forward  # type: ignore[method-assign]
    return span


def nf4_packed(span: ModelSpan) -> ModelSpan:
    """nf4 modules allowed bitsandbytes' CPU repacking (bf16 compute, float32 scales)."""
    for module in span.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = True
    return span


def timed(span: ModelSpan, hidden: torch.Tensor) -> float:
    with torch.no_grad():
        started = time.perf_counter()
        span(hidden)
        return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--blocks", default="0:10", help="START:END of the span to load")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    start, end = (int(x) for x in args.blocks.split(":"))
    cache = Path(tempfile.mkdtemp(prefix="drift-bench-quant-"))
    ckpt = open_checkpoint(args.model, cache_dir=cache, dtype=torch.float32)
    spans = {
        "float32": ModelSpan.load(ckpt, start, end),
        "int8 (DRIFT: weight-only on CPU)": ModelSpan.load(ckpt, start, end, quant="int8"),
        "int8 LLM.int8 (not picked on CPU)": llm_int8(
            ModelSpan.load(ckpt, start, end, quant="int8")
        ),
        "nf4 (DRIFT: generic kernel)": ModelSpan.load(ckpt, start, end, quant="nf4"),
        "nf4 packed bf16 (not picked)": nf4_packed(ModelSpan.load(ckpt, start, end, quant="nf4")),
    }
    gen = torch.Generator().manual_seed(0)
    hidden_size = int(ckpt.config.hidden_size)
    inputs = {t: torch.randn(1, t, hidden_size, generator=gen) for t in (1, 16)}
    reference = {t: spans["float32"](x).detach() for t, x in inputs.items()}
    for span in spans.values():  # warm-up (and nf4 repacking, where allowed)
        for x in inputs.values():
            timed(span, x)
    times: dict[tuple[str, int], list[float]] = {(n, t): [] for n in spans for t in inputs}
    for _ in range(args.reps):  # interleaved: machine noise hits every variant alike
        for t, x in inputs.items():
            for name, span in spans.items():
                times[(name, t)].append(timed(span, x))
    print(f"{ckpt.name} blocks [{start}, {end}), medians of {args.reps} interleaved reps "
          "(shared machine: ratios, not absolute times)")  # fmt: skip
    print("| variant | decode (1 token) vs float32 | prefill (16) vs float32 | output error |")
    print("| --- | --- | --- | --- |")
    for name, span in spans.items():
        ratios = [statistics.median(times[(name, t)]) / statistics.median(times[("float32", t)])
                  for t in inputs]  # fmt: skip
        with torch.no_grad():
            out = span(inputs[16])
        error = float((out - reference[16]).norm() / reference[16].norm())
        print(f"| {name} | {ratios[0]:.2f}x | {ratios[1]:.2f}x | {error:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
