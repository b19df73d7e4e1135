"""What a second OpenMP pool in a process costs a server's decode step (drift/openmp.py).

A server computes on its compute thread; its event loop thread held a pool of its own after
loading. With more pooled workers than CPUs, GNU OpenMP throttles every pool: workers spin
100 times, then sleep between the kernels of a step. In one process, interleaved in random
order, medians of --reps runs of --steps one-token steps over SmolLM2's 30 blocks (float32):
- local transformers' 30 blocks on the main thread (no other pool: the baseline);
- the lean decode step of a span of all 30 blocks on a worker thread (as a server's compute
  thread) while the main thread holds a pool (as a server did before, with its loading's);
- the same with the main thread's pool ended first (as a server does now).

    PYTHONPATH=. .venv/bin/python scripts/bench_omp_pools.py --reps 10
"""

from __future__ import annotations

import argparse
import queue
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

from drift.models.batch import BatchStep  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.span import ModelSpan  # noqa: E402
from drift.models.static_step import LeanDecoder  # noqa: E402
from drift.openmp import worker_release  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    ckpt = open_checkpoint(args.model, dtype=torch.float32)
    local = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    n = int(local.config.num_hidden_layers)
    span = ModelSpan.load(ckpt, 0, n)
    decoder = LeanDecoder(span)
    hidden = int(local.config.hidden_size)
    release = worker_release()

    def local_steps() -> float:
        cache = DynamicCache(config=local.config)
        local.model(inputs_embeds=torch.randn(1, 5, hidden), past_key_values=cache)
        times = []
        for _ in range(args.steps):
            x = torch.randn(1, 1, hidden)
            began = time.perf_counter()
            local.model(inputs_embeds=x, past_key_values=cache)
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e3

    def lean_steps() -> float:
        session = span.new_session(batch_size=1, max_length=args.steps + 8)
        session.step(torch.randn(1, 5, hidden))
        times = []
        for i in range(args.steps):
            x = torch.randn(1, 1, hidden)
            began = time.perf_counter()
            decoder.run([BatchStep(session, 5 + i, x)])
            times.append(time.perf_counter() - began)
        release()  # this worker thread's pool ends: the next run starts with its own alone
        return statistics.median(times) * 1e3

    jobs: queue.Queue[Callable[[], float]] = queue.Queue()
    results: queue.Queue[float] = queue.Queue()

    def worker() -> None:
        while True:
            results.put(jobs.get()())

    threading.Thread(target=worker, daemon=True).start()

    def on_worker(main_pool: bool) -> float:
        if main_pool:
            torch.ones(4_000_000).sum()  # a parallel kernel: the main thread has a pool
        else:
            release()
        jobs.put(lean_steps)
        return results.get()

    runs: dict[str, Callable[[], float]] = {
        "local transformers, main thread": lambda: (release(), local_steps())[1],
        "lean span on a worker thread, main thread's pool alive": lambda: on_worker(True),
        "lean span on a worker thread, main thread's pool ended": lambda: on_worker(False),
    }
    for run in runs.values():  # warm-up
        run()
    got: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for _ in range(args.reps):
        random.shuffle(order)
        for name in order:
            got[name].append(runs[name]())
    base = statistics.median(got["local transformers, main thread"])
    print(f"{args.model}, {n} blocks float32, torch threads {torch.get_num_threads()}, "
          f"medians of {args.reps} runs of {args.steps} one-token steps (ms per step):")  # fmt: skip
    for name, values in got.items():
        med = statistics.median(values)
        print(f"  {name:56s} {med:7.2f}  ({med / base:.2f}x local)  "
              f"[{', '.join(f'{v:.1f}' for v in values)}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
