"""Aggregate decode tokens/s of N concurrent, independent SDK sessions through 2 servers.

SmolLM2 (real weights) served by 2 `drift server` processes on 127.0.0.1, every process on
its default threads as users run them (`--threads 1`, or OMP_NUM_THREADS=1 in the environment:
servers at OMP_NUM_THREADS=1 and the client on one torch thread, the setting of earlier
measurements). Session i is its own client (`from_pretrained`, its own swarm
view and sockets) decoding greedily from its own prompt, in its own thread; N of them start
together and the wall time until the last one ends gives the aggregate tokens/s, printed
against 1 session in the same run. Each session's tokens are checked against its solo run.
The servers batch the steps that queue up while they compute (drift.server.batcher); the
mean batch size is read from their /metrics. The CPU time of the client and of each server
per token is printed too: on a shared machine whose load drifts, how much less CPU a token
costs than with 1 session is the load-independent side of the speed-up.
With --one_model every session is a thread of one model instead (concurrent generate() calls
of one process, as applications and `drift api --max_batch 1` make them): their LM-head
products then share one read of the head's weights (drift.client.shared_head).

    PYTHONPATH=. python scripts/bench_concurrency.py --sessions 1,2,4,8,16
    PYTHONPATH=. python scripts/bench_concurrency.py --sessions 1,8 --one_model
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import ServerProcs, wait_covered  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402

BASE_PROMPT = [1, 504, 2365, 3290, 253]


def prompt(i: int) -> torch.Tensor:
    """Session i's own prompt (same length, a different last token)."""
    return torch.tensor([[*BASE_PROMPT[:-1], BASE_PROMPT[-1] + 7 * i]])


def generate(model: Any, i: int, new: int) -> list[int]:
    """Session i's greedy tokens, as users call generate(): up to `new` (the rates count the
    tokens made; no min_new_tokens, whose logits processors cost ~1 ms of the client's CPU a
    token that users who do not ask for it never pay)."""
    p = prompt(i)
    with torch.no_grad():
        out = model.generate(p, max_new_tokens=new, do_sample=False)
    return out[0, p.shape[1] :].tolist()


def together(models: list[Any], new: int) -> tuple[float, list[list[int]]]:
    """All sessions released at once; (wall seconds until the last ends, each one's tokens)."""
    barrier = threading.Barrier(len(models) + 1)

    def run(i: int) -> list[int]:
        barrier.wait()
        return generate(models[i], i, new)

    with ThreadPoolExecutor(len(models)) as pool:
        futures = [pool.submit(run, i) for i in range(len(models))]
        barrier.wait()
        start = time.perf_counter()
        tokens = [f.result() for f in futures]
        return time.perf_counter() - start, tokens


def batch_stats(urls: list[str]) -> tuple[float, float]:
    """(sum, count) of steps-per-forward over the servers, from their /metrics."""
    total = count = 0.0
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total += float(re.search(r"^drift_step_batch_size_sum (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
        count += float(re.search(r"^drift_step_batch_size_count (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
    return total, count


def pids(procs: Any) -> list[int]:
    return [p.pid for p in procs.procs]


def cpu_seconds(pids: list[int]) -> list[float]:
    """CPU seconds (user + system) used so far by this process and each of `pids`."""
    tick = os.sysconf("SC_CLK_TCK")
    own = os.times()
    out = [own.user + own.system]
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out.append((int(fields[11]) + int(fields[12])) / tick)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sessions", default="1,2,4,8,16", help="session counts to bench")
    parser.add_argument("--new", type=int, default=8, help="new tokens per session")
    parser.add_argument("--reps", type=int, default=3, help="runs per session count (median)")
    parser.add_argument("--one_model", action="store_true",
                        help="every session a thread of one model (concurrent generate() calls "
                        "of one process), not its own client")  # fmt: skip
    parser.add_argument("--batch_wait_ms", type=float, default=None,
                        help="the servers' --batch_wait_ms (default: theirs)")  # fmt: skip
    parser.add_argument("--threads", default=os.environ.get("OMP_NUM_THREADS") or "default",
                        help="'default' (every process's own choice, as users run it) or N: "
                        "servers at OMP_NUM_THREADS=N, the client on N torch threads "
                        "(default: $OMP_NUM_THREADS where set, else 'default')")  # fmt: skip
    args = parser.parse_args()
    if args.threads != "default":
        torch.set_num_threads(int(args.threads))
    counts = [int(c) for c in args.sessions.split(",")]
    directory = open_checkpoint(args.model).path
    models: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = None
        try:
            n = int(open_checkpoint(args.model).config.num_hidden_layers)
            extra = (
                () if args.batch_wait_ms is None else ("--batch_wait_ms", f"{args.batch_wait_ms}")
            )
            procs = ServerProcs(
                str(directory), [(0, n // 2), (n // 2, n)], Path(tmp), extra, threads=args.threads
            )
            for _ in range(1 if args.one_model else max(counts)):
                models.append(AutoDistributedModelForCausalLM.from_pretrained(
                    directory, initial_peers=procs.token))  # fmt: skip
                wait_covered(models[-1], n)
            print(f"servers' decode threads (one row/batches): {', '.join(procs.threads())}",
                  flush=True)  # fmt: skip
            if args.one_model:  # the same model object for every thread
                models = models * max(counts)
            solo = [generate(m, i, args.new) for i, m in enumerate(models)]  # also warms up
            rates: dict[int, list[float]] = {c: [] for c in counts}
            made = dict.fromkeys(counts, 0)  # tokens made, all reps
            same = dict.fromkeys(counts, True)
            cpu = {c: [0.0] * 3 for c in counts}
            batches = {c: [0.0, 0.0] for c in counts}
            for rep in range(args.reps):  # session counts interleaved: the machine's load drifts
                for c in counts:
                    stats0, cpu0 = batch_stats(procs.urls), cpu_seconds(pids(procs))
                    wall, tokens = together(models[:c], args.new)
                    stats1, cpu1 = batch_stats(procs.urls), cpu_seconds(pids(procs))
                    made[c] += sum(len(t) for t in tokens)
                    rates[c].append(sum(len(t) for t in tokens) / wall)
                    same[c] = same[c] and tokens == solo[:c]
                    cpu[c] = [t + b - a for t, a, b in zip(cpu[c], cpu0, cpu1, strict=True)]
                    batches[c] = [batches[c][0] + stats1[0] - stats0[0],
                                  batches[c][1] + stats1[1] - stats0[1]]  # fmt: skip
                    print(f"rep {rep + 1}, {c:>2} sessions: {rates[c][-1]:6.2f} tokens/s",
                          flush=True)  # fmt: skip
        finally:
            for m in {id(m): m for m in models}.values():
                m.close()
            if procs is not None:
                procs.stop()
    report(args, counts, rates, made, same, cpu, batches)


def report(args: Any, counts: list[int], rates: dict[int, list[float]], made: dict[int, int],
           same: dict[int, bool], cpu: dict[int, list[float]],
           batches: dict[int, list[float]]) -> None:  # fmt: skip
    rate = {c: statistics.median(rates[c]) for c in counts}
    base = rate.get(1)
    kind = "threads of one model" if args.one_model else "one client each"
    fewest = min(made[c] / (c * args.reps) for c in counts)  # a session's mean, lowest count
    print(f"\n{args.model}, 2 servers, sessions: {kind}; up to {args.new} new tokens per session "
          f"({fewest:.1f} on average where fewest) after a "
          f"{len(BASE_PROMPT)}-token prompt, medians of {args.reps} interleaved run(s)")  # fmt: skip
    print("| sessions | aggregate tokens/s | vs 1 session | tokens equal solo | steps per "
          "forward | CPU ms/token: client, server 1, server 2 | CPU per token vs 1 session |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    per_token = {c: [x * 1e3 / max(made[c], 1) for x in cpu[c]] for c in counts}
    for c in counts:
        ratio = f"{rate[c] / base:.2f}x" if base else "-"
        total, steps = batches[c]
        per = ", ".join(f"{x:.1f}" for x in per_token[c])
        saving = f"{sum(per_token[1]) / sum(per_token[c]):.2f}x less" if base else "-"
        print(f"| {c} | {rate[c]:.2f} | {ratio} | {'yes' if same[c] else 'NO'} | "
              f"{total / steps if steps else 0:.2f} | {per} | {saving} |")  # fmt: skip


if __name__ == "__main__":
    main()
