"""What output_hidden_states=True costs on the swarm: bytes on the wire and time per call.

SmolLM2 served by 2 `drift server` processes on 127.0.0.1 (scripts/bench_client.py's
ServerProcs). Per setting, interleaved `--reps` times: a forward over a `--prompt`-token
prompt, and `--steps` decode steps continuing a remote cache; each with and without
per-layer states. Prints medians, the ratio with/without (time), and the reply bytes the
client decoded per call (exact: every reply goes through drift.wire.codec.decode).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_hidden_states.py --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import ServerProcs, wait_covered  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.wire import codec  # noqa: E402


class ReplyBytes:
    """Bytes of every frame the client decodes, while `on`."""

    def __init__(self) -> None:
        self.total = 0
        self.on = False
        self._decode = codec.decode

    def __call__(self, cls: Any, body: bytes, *args: Any, **expect: Any) -> Any:
        if self.on:
            self.total += len(body)
        return self._decode(cls, body, *args, **expect)


BYTES = ReplyBytes()
codec.decode = BYTES  # type: ignore[assignment]


def measure(fn: Any) -> tuple[float, int]:
    """(seconds, reply bytes) of one call of fn()."""
    BYTES.total, BYTES.on = 0, True
    start = time.perf_counter()
    try:
        with torch.no_grad():
            fn()
    finally:
        BYTES.on = False
    return time.perf_counter() - start, BYTES.total


def forward(model: Any, ids: torch.Tensor, states: bool) -> Any:
    return lambda: model(ids, use_cache=False, output_hidden_states=states)


def decode(model: Any, ids: torch.Tensor, steps: int, states: bool) -> Any:
    """The prompt goes into a remote cache now (untimed); the steps continue it."""
    with torch.no_grad():
        first = model(ids, use_cache=True)

    def run() -> None:
        out = first
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(nxt, cache=first.cache, output_hidden_states=states)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = open_checkpoint(args.model).path
    ids = torch.randint(10, 1000, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = defaultdict(list)
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = None
        procs = None
        try:
            n = open_checkpoint(args.model).config.num_hidden_layers
            procs = ServerProcs(str(directory), [(0, n // 2), (n // 2, n)], Path(tmp))
            model = AutoDistributedModelForCausalLM.from_pretrained(
                directory, initial_peers=procs.token
            )
            wait_covered(model, n)
            cases = {
                f"forward {args.prompt} tokens": lambda s: forward(model, ids, s),
                f"{args.steps} decode steps": lambda s: decode(model, ids, args.steps, s),
            }
            for make in cases.values():  # warm up
                measure(make(False))
            for rep in range(args.reps):
                for name, make in cases.items():
                    for states in (False, True):
                        key = f"{name}, states={states}"
                        seconds, size = measure(make(states))
                        times[key].append(seconds)
                        sizes[key] = size
                print(f"rep {rep + 1} done", flush=True)
        finally:
            if model is not None:
                model.close()
            if procs is not None:
                procs.stop()
    report(args, times, sizes)


def report(args: Any, times: dict[str, list[float]], sizes: dict[str, int]) -> None:
    print(f"\n{args.model} on 2 servers, medians of {args.reps} interleaved runs")
    names = sorted({k.rsplit(", ", 1)[0] for k in times})
    for name in names:
        off, on = f"{name}, states=False", f"{name}, states=True"
        t_off, t_on = statistics.median(times[off]), statistics.median(times[on])
        paired = [b / a for a, b in zip(times[off], times[on], strict=True)]
        print(f"{name}: {t_off * 1e3:8.1f} ms -> {t_on * 1e3:8.1f} ms with states "
              f"(ratio {t_on / t_off:.2f}x; per-rep median {statistics.median(paired):.2f}x); "
              f"reply bytes {sizes[off]:,} -> {sizes[on]:,} ({sizes[on] / sizes[off]:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
