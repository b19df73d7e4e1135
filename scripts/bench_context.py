"""Long contexts: TTFT and decode s/token of the swarm against local transformers.

SmolLM2 (or `--model`, e.g. gemma3-270m) served by 2 `drift server` processes on 127.0.0.1
(blocks split in half), against local transformers generate() on the same weights, in the
same run. Threads: `--threads default` (none set anywhere, as users run it; or this shell's
OMP_NUM_THREADS, for every process) or a number for every process.
For each context length: greedy generate() of `--new` tokens after a random prompt of that
many tokens; a streamer stamps each token, so TTFT is the prompt's prefill and first token,
decode the median time between the later tokens. Also printed: the tokens each server
computed during the prefill and in all (its /metrics drift_tokens_total; a prompt crosses
each server once: prefill == prompt length), whether the tokens equal local's, and the
servers' summed step time during the prefill and per decode step (drift_step_latency_
seconds_sum: from a step's arrival to its reply, so TTFT minus it is the client's and the
wire's share when the servers take chunks in turn).

    PYTHONPATH=. python scripts/bench_context.py --lengths 128,1024,4096
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import ServerProcs, wait_covered  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM, ClientConfig  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402


def tokens_total(urls: list[str]) -> list[tuple[int, float]]:
    """Each server's drift_tokens_total and summed step latency (seconds) so far."""
    out = []
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        found = re.search(r"^drift_tokens_total (\S+)", text, re.M)
        steps = re.search(r"^drift_step_latency_seconds_sum (\S+)", text, re.M)
        assert found and steps, text
        out.append((int(float(found.group(1))), float(steps.group(1))))
    return out


class Stamps:
    """A generate() streamer: the time of each put (the prompt's, then each new token's);
    `at_first` runs once the first new token is out, its time left out of the stamps."""

    def __init__(self, at_first: Any = None) -> None:
        self.times: list[float] = []
        self.at_first = at_first
        self.skew = 0.0  # seconds spent in at_first, taken off the later stamps

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter() - self.skew)
        if len(self.times) == 2 and self.at_first is not None:
            t0 = time.perf_counter()
            self.at_first()
            self.skew += time.perf_counter() - t0

    def end(self) -> None:
        pass


def timed(
    model: Any, ids: torch.Tensor, new: int, at_first: Any = None
) -> tuple[float, float, list[int]]:
    """(TTFT s, median decode s/token, the new tokens) of one greedy generate()."""
    stamps = Stamps(at_first)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             streamer=stamps)  # fmt: skip
    t = stamps.times
    steps = [b - a for a, b in zip(t[1:], t[2:], strict=False)]
    return t[1] - t[0], statistics.median(steps), out[0, ids.shape[1] :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", default="128,1024,4096", help="prompt tokens, comma-separated")
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", default="default",
                        help="compute threads per process: 'default' (none set: as users run "
                        "it) or a number (default: default)")  # fmt: skip
    parser.add_argument("--prefill_chunk_tokens", type=int, default=None,
                        help="the client's prefill chunk (default: ClientConfig's)")  # fmt: skip
    parser.add_argument("--server_args", default="",
                        help="more `drift server` flags for both servers, e.g. '--decode_threads 2'")  # fmt: skip
    args = parser.parse_args()
    config = ClientConfig()
    if args.prefill_chunk_tokens is not None:
        config = dataclasses.replace(config, prefill_chunk_tokens=args.prefill_chunk_tokens)
    if args.threads == "default" and os.environ.get("OMP_NUM_THREADS"):
        args.threads = os.environ["OMP_NUM_THREADS"]  # what this shell asks for, everywhere
    if args.threads != "default":
        torch.set_num_threads(int(args.threads))
    lengths = [int(x) for x in args.lengths.split(",")]
    ckpt = open_checkpoint(args.model)
    local = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    n = int(ckpt.config.get_text_config().num_hidden_layers)
    vocab = int(ckpt.config.get_text_config().vocab_size)
    room = max(lengths) + args.new + 64
    flags = ("--inference_max_length", str(room), "--attn_cache_tokens", str(max(8192, room)),
             *shlex.split(args.server_args))  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = ServerProcs(str(ckpt.path), [(0, n // 2), (n // 2, n)], Path(tmp), flags,
                            threads=args.threads)  # fmt: skip
        model = None
        try:
            model = AutoDistributedModelForCausalLM.from_pretrained(
                ckpt.path, initial_peers=procs.token, client_config=config)  # fmt: skip
            wait_covered(model, n)
            print(
                "client generate() threads:",
                model.generate_threads or "torch's own",
                {k: round(v * 1e3, 2) for k, v in model.generate_threads_s.items()},
                flush=True,
            )
            for url in procs.urls:
                with urllib.request.urlopen(f"{url}/blocks", timeout=10) as resp:
                    print(url, "decode:", json.loads(resp.read())["decode"], flush=True)
            warm = torch.randint(0, vocab, (1, 32), generator=torch.Generator().manual_seed(1))
            timed(model, warm, 3)
            timed(local, warm, 3)
            for length in lengths:
                ids = torch.randint(0, vocab, (1, length),
                                    generator=torch.Generator().manual_seed(length))  # fmt: skip
                for _ in range(args.reps):
                    lt, ls, ltok = timed(local, ids, args.new)
                    before = tokens_total(procs.urls)
                    prefill: list[int] = []
                    dt, ds, dtok = timed(model, ids, args.new,
                                         lambda p=prefill: p.extend(tokens_total(procs.urls)))  # fmt: skip
                    after = tokens_total(procs.urls)
                    rows.append((length, lt, dt, ls, ds,
                                 [p[0] - b[0] for p, b in zip(prefill, before, strict=True)],
                                 [a[0] - b[0] for a, b in zip(after, before, strict=True)],
                                 ltok == dtok,
                                 sum(p[1] - b[1] for p, b in zip(prefill, before, strict=True)),
                                 sum(a[1] - p[1] for a, p in zip(after, prefill, strict=True))
                                 / max(args.new - 1, 1)))  # fmt: skip
                    print(rows[-1], flush=True)
        finally:
            if model is not None:
                model.close()
            procs.stop()
    print(f"\n{args.model} float32, 2 servers [0, {n // 2}) / [{n // 2}, {n}) on loopback, greedy "
          f"{args.new} new tokens, threads: {args.threads}, local transformers in the same run")  # fmt: skip
    print(
        "| prompt tokens | local TTFT | DRIFT TTFT | TTFT ratio | local s/token | DRIFT s/token "
        "| decode speed vs local | tokens each server computed: prefill / all | same tokens "
        "| servers' summed step time in the prefill | the same, per decode step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for length, lt, dt, ls, ds, pre, total, same, served, served_step in rows:
        counts = ", ".join(f"{p} / {t}" for p, t in zip(pre, total, strict=True))
        print(
            f"| {length:,} | {lt:.2f} s | {dt:.2f} s | {dt / lt:.2f}x | {ls:.3f} | {ds:.3f} "
            f"| {ls / ds:.2f}x | {counts} | {'yes' if same else 'NO'} | {served:.2f} s "
            f"| {served_step:.3f} s |"
        )


if __name__ == "__main__":
    main()
