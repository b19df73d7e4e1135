"""How many torch threads the client's own work runs on inside generate(): measured at load.

Each generated token, the client's thread waits for the servers, is woken by the client's
loop thread with the reply, then computes the head and transformers' sampling: a burst of
small products after a pause, on a team of torch threads. After a pause the scheduler may
run the team's threads on one core, taking turns (drift.models.threads): on this 2-vCPU
machine a woken 2-thread team took 20.5 ms (median) for SmolLM2's head and sampling where
one thread took 11.7, and a swarm decoded at 0.86x local transformers with the client on
torch's 2 threads, 0.95x on one (scripts/bench_client.py).

So, unless the client config fixes it (`ClientConfig.generate_threads`), loading a CPU model
times the head after waits on the loop thread, on torch's count and on one thread, and
keeps torch's count only where it is clearly faster (drift.models.threads.choose).
generate() then runs on that count, on the thread that calls it (drift.models.threads).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from drift.models.row_kernel import activated, kernel_in, product_of
from drift.models.rows import measure
from drift.models.threads import choose, threads

log = logging.getLogger(__name__)


def generate_threads(head: Any, client: Any, setting: int | None) -> tuple[int | None, dict]:
    """(threads generate() runs on, None: torch's own; the median seconds measured of each
    count) for `setting` (ClientConfig.generate_threads: None measured, 0 torch's own, N)."""
    if setting is not None:
        return (setting or None), {}
    weight = head.lm_head.weight
    default = torch.get_num_threads()
    if weight.device.type != "cpu" or default <= 1:
        return None, {}
    hidden = torch.zeros(1, 1, weight.shape[1], dtype=weight.dtype)

    kernel = kernel_in(head)

    def step() -> None:
        with torch.no_grad(), activated(kernel):  # as in generate()
            head.project(hidden).argmax(-1)

    def pause(seconds: float) -> None:  # woken by the loop thread, as by a step's reply
        client.run(asyncio.sleep(seconds))

    chosen, medians = choose(step, default, pause=pause)
    log.info("generate() runs on %d torch thread(s): the head after a wait took %s", chosen,
             ", ".join(f"{s * 1e3:.1f} ms on {n}" for n, s in medians.items()))  # fmt: skip
    return (None if chosen == default else chosen), medians


def head_row_pads(head: Any, n: int | None) -> None:
    """Measure and set `head.row_pads` (drift.models.rows) on `n` threads (generate()'s):
    the head's products of 2-8 rows (a batch, drift api's rows, calls sharing a pass)."""
    if type(head.lm_head) is not torch.nn.Linear:
        return
    with threads(n), activated(kernel_in(head)):  # as in generate()
        pads, medians = measure([head.lm_head.weight], product=product_of(head.lm_head))
    head.row_pads = pads
    if medians:
        log.info("the head's products of 1-%d rows took %s ms; padded %s", len(medians),
                 ", ".join(f"{s * 1e3:.1f}" for s in medians.values()), pads or "none")  # fmt: skip
