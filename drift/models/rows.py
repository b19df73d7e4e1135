"""Few-row products on the CPU, padded with zero rows where the BLAS serves more rows faster.

torch's CPU BLAS (MKL here) multiplies 2 or 3 float32 rows by a weight about as one
matrix-vector product per row, each reading the whole weight from memory, and 4 rows in one
blocked pass. On this project's machine (one thread, weights read from memory):
- SmolLM2's 15-block span, one decode step of 1 / 2 / 3 / 4 sessions: 22.7 / 33.2 / 38.4 /
  32.4 ms (scripts/bench_kernels.py --rows N);
- its head (49,152 x 576): 9.5 / 24.3 / 36.6 / 17.1 ms for 1 / 2 / 3 / 4 rows.
Two or three users decoding together (drift api, concurrent generate() calls, a batch of
prompts) are that common case.

So a product of a few rows may run on more: `measure` times one pass over the weights
themselves at every row count up to MAX_ROWS (the table depends on the CPU, the BLAS, the
dtype and the thread count, so nothing is assumed) and keeps a count m -> m' > m only where
m' rows took at least GAIN less time than m. bfloat16 products here showed no such steps,
and weights that fit in the CPU's caches (MIN_BYTES) are not measured at all: no table.
Padded rows are zeros and are dropped; every real row is still its own product over the same
weights (within float rounding of the unpadded product, as in any batch). Knows nothing of
servers or clients.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from drift.models.threads import threads

Product = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]

MAX_ROWS = 8  # row counts measured (and padded) up to this
GAIN = 0.10  # a count is padded only to one at least this much faster
ROUNDS = 5  # timed passes per row count (interleaved); the median counts
MIN_BYTES = 32 << 20  # weights smaller than this stay in the CPU's caches: not measured
PASS_BYTES = 64 << 20  # a timed pass reads at most this much of the weights

RowPads = Mapping[int, int]  # rows -> the rows to compute them as (only counts that pad)


def padded(pads: RowPads, rows: int) -> int:
    """The rows a product of `rows` rows runs as."""
    return pads.get(rows, rows)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pads: RowPads,
           product: Product | None = None) -> torch.Tensor:  # fmt: skip
    """product(x, weight, bias) (drift.models.row_kernel's; default F.linear) with x's rows
    (every dim but the last) padded per `pads`."""
    product = product or torch.nn.functional.linear
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    to = padded(pads, rows)
    if to == rows:
        return product(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    out = product(pad(flat, to), weight, bias)[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [n, ...] with zero rows appended up to `rows` (x itself where n >= rows)."""
    extra = rows - int(x.shape[0])
    return x if extra <= 0 else torch.cat([x, x.new_zeros(extra, *x.shape[1:])])


def measurable(weights: Sequence[torch.Tensor]) -> bool:
    """Weights worth a table: 2-D float on the CPU, more of them than the caches hold."""
    return (
        bool(weights)
        and all(
            w.device.type == "cpu" and w.dim() == 2 and w.dtype.is_floating_point for w in weights
        )  # fmt: skip
        and sum(w.numel() * w.element_size() for w in weights) >= MIN_BYTES
    )


def measure(weights: Sequence[torch.Tensor], *, rounds: int = ROUNDS, max_rows: int = MAX_ROWS,
            product: Product | None = None, threads_for: Callable[[int], int | None] | None = None,
            ) -> tuple[dict[int, int], dict[int, float]]:  # fmt: skip
    """(the pads table, the median seconds of one pass at each row count) for products of
    few rows by `weights` through `product` (as their layers compute them; default F.linear)
    on the calling thread's torch threads (`threads_for(rows)`: on that many for passes of
    that many rows, None: as they are), a pass reading their first PASS_BYTES (a weight's
    first rows where it alone is bigger: Gemma 3's head is 640 MiB); no table (and nothing
    timed) where the weights are not `measurable`."""
    if not measurable(weights):
        return {}, {}
    product = product or torch.nn.functional.linear
    chosen, total = [], 0
    for w in weights:  # the first PASS_BYTES of them: a layer's every shape comes first
        row_bytes = int(w.shape[1]) * w.element_size()
        if total + row_bytes > PASS_BYTES:
            break
        w = w[: (PASS_BYTES - total) // row_bytes]  # (a head bigger than a pass: its first rows)
        chosen.append(w)
        total += w.numel() * w.element_size()
    inputs = {m: {int(w.shape[1]): torch.zeros(m, int(w.shape[1]), dtype=w.dtype)
                  for w in chosen} for m in range(1, max_rows + 1)}  # fmt: skip

    def one_pass(m: int) -> None:
        with threads(None if threads_for is None else threads_for(m)):
            for w in chosen:
                product(inputs[m][int(w.shape[1])], w, None)

    return table(one_pass, rounds=rounds, max_rows=max_rows)


def table(one_pass: Callable[[int], None], *, rounds: int = ROUNDS,
          max_rows: int = MAX_ROWS) -> tuple[dict[int, int], dict[int, float]]:  # fmt: skip
    """Time `one_pass(m)` for m = 1..max_rows, `rounds` times each, interleaved; pad m to the
    fastest m' >= m where that is at least GAIN faster than m itself."""
    times: dict[int, list[float]] = {m: [] for m in range(1, max_rows + 1)}
    with torch.no_grad():
        one_pass(1)  # warm
        for _ in range(rounds):
            for m, seen in times.items():
                started = time.perf_counter()
                one_pass(m)
                seen.append(time.perf_counter() - started)
    medians = {m: statistics.median(seen) for m, seen in times.items()}
    pads = {}
    for m in medians:
        best = min(range(m, max_rows + 1), key=lambda k: (medians[k], k))
        if best != m and medians[best] <= (1 - GAIN) * medians[m]:
            pads[m] = best
    return pads, medians
