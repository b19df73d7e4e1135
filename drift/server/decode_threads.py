"""How many threads a CPU server's decode steps run on: measured at start-up, where not set.

A decode step (one token per session) is a burst of small products after a pause: in a
pipeline the server waits while the client and the other servers compute. A team of torch
threads pays for it only while the team's threads run at once, and after a pause the
scheduler may put them on one core (drift.models.threads). On this 2-vCPU machine (a
Firecracker guest), `perf sched timehist` during a SmolLM2 swarm's decode showed each
server's compute thread and its OpenMP worker taking turns on one vCPU while the other
idled for 20-28 ms, and the client's main thread and worker doing the same in its head:
2 servers decoded at 0.73-0.77x local transformers on torch's 2 threads, 0.92x with every
thread bound to its own core (OMP_PROC_BIND=true), 0.86x with the servers' decode steps on
one thread (scripts/bench_client.py).

So, unless the operator chose (`--decode_threads N`, or OMP_NUM_THREADS), a CPU server
times decode steps after pauses on torch's thread count and on one thread, interleaved,
and keeps torch's count only where it is clearly faster (`choose`); SmolLM2's 15 blocks
here took 24-26 ms a step either way. Only plain decode steps run on the choice
(`SpanBackend.run_steps`); prompts keep every thread, even short ones: with a 5-token
prompt the team paid (time to first token through 2 servers 76 ms with prompt steps on 2
threads, 88 ms on 1; local transformers 70).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from drift.models.batch import BatchStep
from drift.models.session import SpanSession
from drift.models.threads import ROUNDS, choose

log = logging.getLogger(__name__)

# Decode steps of this many rows or more (the rows of every session in the step) run on the
# count timed on steps of that many rows (`batch_threads`): a batch computes longer between
# pauses, so a team pays off sooner. SmolLM2's 15 blocks with the row kernel, timed after
# pauses alone on this machine: 1 row 12.8 ms on 2 threads, 17.9 on 1; 4 rows 19.8 and 30.8;
# 8 rows 29.6 and 42.7. Servers starting beside each other time one-row steps amid each
# other's loading (16.6 against 16.3 ms: one thread chosen); their batches then lost ~30%.
BATCH_ROWS = 4


def attach_decode_threads(backend: Any, setting: int | None) -> dict[str, Any]:
    """Set `backend.decode_threads` and `backend.batch_threads` (drift.server.backend.
    SpanBackend) for `setting` (ServerConfig.decode_threads): N, torch's own (0), or measured
    (None: `choose` on the compute thread, on scratch sessions of 1 and BATCH_ROWS rows) on a
    CPU; returns what /blocks shows of it."""
    default = torch.get_num_threads()
    chosen, why, medians = default, "torch's own", {}
    batch, batch_medians = default, {}
    if setting:
        chosen, batch, why = setting, setting, "--decode_threads"
    elif setting == 0:
        pass
    elif backend.span.device.type != "cpu":
        why = "an accelerator's step"
    elif backend.span.extra_spec(backend.start_block, backend.end_block).inputs:
        why = "not measured: the span's steps take per-layer inputs"
    elif default > 1:
        chosen, medians = backend.executor.submit(_measure, backend, default, 1).result()
        batch, batch_medians = backend.executor.submit(_measure, backend, default,
                                                       BATCH_ROWS).result()  # fmt: skip
        why = "measured after pauses"
    backend.decode_threads, backend.batch_threads = chosen, batch
    shown: dict[str, Any] = {"threads": chosen, "threads_reason": why, "batch_threads": batch,
                             "batch_rows": BATCH_ROWS}  # fmt: skip
    for key, rows, n, timed in (("threads_ms", 1, chosen, medians),
                                ("batch_threads_ms", BATCH_ROWS, batch, batch_medians)):  # fmt: skip
        if timed:
            shown[key] = {str(k): round(s * 1e3, 2) for k, s in timed.items()}
            log.info("decode steps of %d row(s) run on %d thread(s): after a pause one took %s",
                     rows, n, ", ".join(f"{s * 1e3:.1f} ms on {k}" for k, s in timed.items()))  # fmt: skip
    return shown


def _measure(backend: Any, default: int, rows: int) -> tuple[int, dict[int, float]]:
    """(Compute thread) `choose` on a scratch session of the span of `rows` rows: decode
    steps of one token, each at the next position."""
    span = backend.span
    session = SpanSession(span, span.start_block, span.end_block, batch_size=rows,
                          max_length=2 * ROUNDS + 4)  # fmt: skip
    hidden = torch.zeros(rows, 1, backend.hidden_size, dtype=span.dtype)
    position = 0

    def step() -> None:
        nonlocal position
        backend.compute_steps([BatchStep(session, position, hidden)])
        position += 1

    try:
        return choose(step, default)
    finally:
        session.close()
