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


def attach_decode_threads(backend: Any, setting: int | None) -> dict[str, Any]:
    """Set `backend.decode_threads` (drift.server.backend.SpanBackend) for `setting`
    (ServerConfig.decode_threads): N, torch's own (0), or measured (None: `choose` on the
    compute thread, on a scratch session) on a CPU; returns what /blocks shows of it."""
    default = torch.get_num_threads()
    chosen, why, medians = default, "torch's own", {}
    if setting:
        chosen, why = setting, "--decode_threads"
    elif setting == 0:
        pass
    elif backend.span.device.type != "cpu":
        why = "an accelerator's step"
    elif backend.span.extra_spec(backend.start_block, backend.end_block).inputs:
        why = "not measured: the span's steps take per-layer inputs"
    elif default > 1:
        chosen, medians = backend.executor.submit(_measure, backend, default).result()
        why = "measured after pauses"
    backend.decode_threads = chosen
    shown = {"threads": chosen, "threads_reason": why}
    if medians:
        shown["threads_ms"] = {str(n): round(s * 1e3, 2) for n, s in medians.items()}
        log.info("decode steps run on %d thread(s): a step after a pause took %s", chosen,
                 ", ".join(f"{s * 1e3:.1f} ms on {n}" for n, s in medians.items()))  # fmt: skip
    return shown


def _measure(backend: Any, default: int) -> tuple[int, dict[int, float]]:
    """(Compute thread) `choose` on a scratch session of the span: decode steps of one
    token, each at the next position."""
    span = backend.span
    session = SpanSession(span, span.start_block, span.end_block, batch_size=1,
                          max_length=2 * ROUNDS + 4)  # fmt: skip
    hidden = torch.zeros(1, 1, backend.hidden_size, dtype=span.dtype)
    position = 0

    def step() -> None:
        nonlocal position
        backend.compute_steps([BatchStep(session, position, hidden)])
        position += 1

    try:
        return choose(step, default)
    finally:
        session.close()
