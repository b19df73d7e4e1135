"""What OpenMP's spinning costs a pipeline of processes sharing a machine (no DRIFT).

Two processes take turns as two servers of a swarm do: A computes a step (a chain of
one-row products the size of 15 SmolLM2 blocks, 212 MB of float32 weights, torch's default
threads), hands it to B, B computes its step and hands it back after `--pause_ms` (the
client's head). After each step a process's OpenMP workers spin before they sleep: with
libgomp's default (300,000 spins) they spin milliseconds into the next process's step, on
the same cores. Runs torch's default and DRIFT's bound (GOMP_SPINCOUNT=10000, set by the
`drift` commands: drift/openmp.py) interleaved `--pairs` times and prints, per setting,
the median step of A and of B (B starts right after A), B/A, a whole round, and the CPU
time each process burns while it waits (its spinning).

    PYTHONPATH=. .venv/bin/python scripts/bench_spin.py --pairs 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift.openmp import BOUNDED_SPINS, SPIN_VAR, USER_VARS  # noqa: E402

HIDDEN, INNER, BLOCKS = 576, 3072, 15  # 15 x 2 x 576 x 3072 floats: SmolLM2's 15 blocks' size


def _server(rx, tx, out, steps: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(HIDDEN, INNER, generator=gen), torch.randn(INNER, HIDDEN, generator=gen))
               for _ in range(BLOCKS)]  # fmt: skip
    x = torch.randn(1, HIDDEN, generator=gen)
    computed, idle = [], []
    for _ in range(steps):
        cpu = time.process_time()
        rx.recv()
        idle.append(time.process_time() - cpu)
        start = time.perf_counter()
        h = x
        for up, down in weights:
            h = torch.nn.functional.silu(h @ up) @ down
        computed.append(time.perf_counter() - start)
        tx.send(1)
    warm = 5
    out.send((statistics.median(computed[warm:]) * 1e3, statistics.mean(idle[warm:]) * 1e3))


def child(steps: int, pause_ms: float) -> dict[str, float]:
    """One run: A and B (spawned: each loads libgomp with this process's environment)."""
    ctx = mp.get_context("spawn")
    to_a_r, to_a_w = ctx.Pipe(False)
    a_to_b_r, a_to_b_w = ctx.Pipe(False)
    back_r, back_w = ctx.Pipe(False)
    outs = [ctx.Pipe(False) for _ in range(2)]
    procs = [ctx.Process(target=_server, args=(to_a_r, a_to_b_w, outs[0][1], steps)),
             ctx.Process(target=_server, args=(a_to_b_r, back_w, outs[1][1], steps))]  # fmt: skip
    for p in procs:
        p.start()
    time.sleep(3.0)  # both load their weights
    rounds = []
    for _ in range(steps):
        start = time.perf_counter()
        to_a_w.send(1)
        back_r.recv()
        time.sleep(pause_ms / 1e3)
        rounds.append(time.perf_counter() - start)
    (a_ms, a_idle), (b_ms, b_idle) = (r.recv() for r, _ in outs)
    for p in procs:
        p.join()
    return {"a": a_ms, "b": b_ms, "round": statistics.median(rounds[5:]) * 1e3,
            "idle_cpu": (a_idle + b_idle) / 2}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--pause_ms", type=float, default=5.0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.steps, args.pause_ms)))
        return
    plain = {k: v for k, v in os.environ.items() if k not in USER_VARS}
    settings = {
        "torch default": plain,
        f"{SPIN_VAR}={BOUNDED_SPINS}": plain | {SPIN_VAR: BOUNDED_SPINS},
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--pause_ms",
           str(args.pause_ms)]  # fmt: skip
    for _ in range(args.pairs):
        for name, env in settings.items():
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            run = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(run)
            print(f"{name:>22}: A {run['a']:5.1f} ms  B {run['b']:5.1f} ms  B/A "
                  f"{run['b'] / run['a']:.2f}  round {run['round']:5.1f} ms  CPU burnt waiting "
                  f"{run['idle_cpu']:4.1f} ms per step", flush=True)  # fmt: skip
    print(f"\nmedians of {args.pairs} interleaved runs ({args.steps} steps each, "
          f"{args.pause_ms:g} ms pause):")  # fmt: skip
    print("| setting | A ms | B ms | B/A | round ms | CPU burnt waiting, ms per step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    for name, m in med.items():
        ratio = statistics.median(r["b"] / r["a"] for r in runs[name])
        print(f"| {name} | {m['a']:.1f} | {m['b']:.1f} | {ratio:.2f} | {m['round']:.1f} | "
              f"{m['idle_cpu']:.1f} |")  # fmt: skip
    default, bounded = med.values()
    print(f"round, bounded vs default: {bounded['round'] / default['round']:.2f}x the time")


if __name__ == "__main__":
    main()
