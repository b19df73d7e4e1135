"""Decode tokens/s of the swarm against local transformers generate() on the same model.

SmolLM2 served by 2 and 3 `drift server` processes on 127.0.0.1 (threads: below);
greedy decoding of `--new` tokens; local, 2-server and 3-server runs interleaved `--reps`
times; prints medians, the ratio swarm/local (Petals 2.2 gets 0.41x) and where a swarm token's
time goes: client head (embed + logits), each hop's reply wait (relayed: its round trip;
pushed, the default: the span's compute and one link after the previous reply; `--relay`
relays), each server's step time and the forward (compute) within it (from its /metrics:
the rest of a step is its queueing, validation and push) and what is left (generate() and
client glue). generate() is called as users call it (no `min_new_tokens`).

Products: the servers' decode steps and the client's head in generate() compute few-row
float32 products on DRIFT's C kernel (drift.models.row_kernel) by default (the servers'
prompts stay on torch's BLAS), local transformers on torch's BLAS. `--row_kernel off` runs the
swarm on torch's BLAS too; `--local_kernel` also times local transformers with the kernel in
its linears, active in generate() (`local+kernel`; its 5-token prompt runs on the kernel too):
the swarm against the same products.

Threads: by default none are set anywhere (`--threads default`: local transformers, the
client and every `drift server` use torch's own default, as users run them), unless this
shell sets OMP_NUM_THREADS, which then applies to every process; `--threads N` gives every
process N compute threads (decoding is a pipeline, so one process computes at a time).
Time to first token: one generate() of a single new token, three times per rep, local then
each swarm right after (a prompt's pass swings more than a decode step's), with
the same parts timed (the prompt's pass through the blocks or servers, the head, the rest).

    .venv/bin/python scripts/bench_client.py --new 32 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoModelForCausalLM  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM, ClientConfig  # noqa: E402
from drift.client.transport import SpanSocket  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.row_kernel import RowKernel, activated  # noqa: E402
from drift.paths import resolve_cache_dir  # noqa: E402

PROMPT = torch.tensor([[1, 504, 2365, 3290, 253]])
FIRSTS_PER_REP = 3  # time-to-first-token pairs (local, then each swarm) per rep


class Timers:
    """Seconds spent per label, filled by the wrappers below during one timed generate()."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.on = False

    def wrap(self, label_of: Any, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._record(label_of, args, t0)

        return timed

    def wrap_async(self, label_of: Any, fn: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self._record(label_of, args, t0)

        return timed

    def _record(self, label_of: Any, args: tuple[Any, ...], t0: float) -> None:
        if self.on:
            label = label_of(args)
            self.total[label] += time.perf_counter() - t0
            self.calls[label] += 1


TIMERS = Timers()
# relayed, a hop's wait is its round trip; pushed (the default), the wait for each span's
# reply after the previous one's: its compute and one link
SpanSocket.receive = TIMERS.wrap_async(  # type: ignore[method-assign]
    lambda a: f"hop [{a[0].hop.start_block:>2}, {a[0].hop.end_block:>2}) reply wait",
    SpanSocket.receive,
)


class ServerProcs:
    """`drift server` processes over consecutive spans, joined into one swarm."""

    def __init__(self, model: str, spans: list[tuple[int, int]], tmp: Path,
                 extra: tuple[str, ...] | list[str] = (), threads: str = "1") -> None:  # fmt: skip
        """`extra`: more `drift server` flags for every server (e.g. --adapters); `threads`:
        each server's OMP_NUM_THREADS, or "default" for none (torch's own choice)."""
        self.procs: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self.spans = spans
        self.token = ""
        env = {k: v for k, v in os.environ.items()
               if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}  # fmt: skip
        if threads != "default":
            env |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        for i, (start, end) in enumerate(spans):
            log = tmp / f"server-{start}-{end}.log"
            cmd = [sys.executable, "-m", "drift.cli", "server", model, "--block_indices",
                   f"{start}:{end}", "--host_maddrs", "/ip4/127.0.0.1/tcp/0",
                   "--throughput", "100", "--cache_dir", str(tmp), "--plain_http",
                   *extra]  # fmt: skip
            if i:
                cmd += ["--initial_peers", self.token]
            with open(log, "wb") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, env=env))
            text = self._wait_for(log, r"join token: (\S+)")
            port = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
            assert port, text
            self.urls.append(f"http://127.0.0.1:{port.group(1)}")
            self.token = self.token or re.search(r"join token: (\S+)", text).group(1)  # type: ignore[union-attr]

    def _wait_for(self, log: Path, pattern: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if re.search(pattern, text):
                return text
            if self.procs[-1].poll() is not None:
                raise RuntimeError(f"server exited:\n{text}")
            time.sleep(0.2)
        raise TimeoutError(f"no {pattern!r} in {log}")

    def sums(self, *names: str) -> list[list[tuple[float, int]]]:
        """Per server (one read of its /metrics), the (sum, count) of each histogram named."""
        out = []
        for url in self.urls:
            with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
                text = resp.read().decode()
            found = []
            for name in names:
                total = re.search(rf"^{name}_sum (\S+)", text, re.M)
                count = re.search(rf"^{name}_count (\S+)", text, re.M)
                found.append((float(total.group(1)), int(count.group(1))))  # type: ignore[union-attr]
            out.append(found)
        return out

    def step_seconds(self) -> list[tuple[float, int]]:
        """(sum, count) of each server's inference step latency, from its /metrics."""
        return [found[0] for found in self.sums("drift_step_latency_seconds")]

    def server_seconds(self) -> list[tuple[float, float]]:
        """Each server's summed step latency and, within it, its steps' forwards (compute)."""
        both = self.sums("drift_step_latency_seconds", "drift_step_forward_seconds")
        return [(steps[0], forwards[0]) for steps, forwards in both]

    def server_rows(self, before: list[tuple[float, float]], per: int,
                    rows: dict[str, list[float]]) -> None:  # fmt: skip
        """Append each server's step time and the forward within it since `before`, in ms
        per `per` tokens, to `rows`."""
        after = self.server_seconds()
        for (a, b), (s0, f0), (s1, f1) in zip(self.spans, before, after, strict=True):
            rows[f"  server [{a:>2}, {b:>2}) step time (in its hop)"].append((s1 - s0) / per * 1e3)
            rows[f"    [{a:>2}, {b:>2}) of which its forward"].append((f1 - f0) / per * 1e3)

    def threads(self) -> list[str]:
        """Each server's decode threads as /blocks shows them: "one-row/batch" (or "?")."""
        out = []
        for url in self.urls:
            try:
                with urllib.request.urlopen(f"{url}/blocks", timeout=5) as resp:
                    decode = json.load(resp).get("decode", {})
                out.append(f"{decode.get('threads', '?')}/{decode.get('batch_threads', '?')}")
            except (OSError, ValueError):
                out.append("?")
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_covered(model: Any, num_blocks: int, timeout: float = 120) -> None:
    """Until the client's swarm view routes every block (gossip may lag a few seconds)."""
    client = model.client
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.run(client.swarm.refresh(force=True))
            client.run(client.route(0, num_blocks, inference=True))
            return
        except Exception:  # noqa: BLE001 -- MissingBlocks until every record arrives
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def timed_generate(model: Any, new: int) -> float:
    """Seconds per generated token of one greedy generate() of `new` tokens, called as users
    call it (no `min_new_tokens`: its logits processors cost ~1 ms a token on SmolLM2's
    vocabulary; PROMPT meets no end-of-text within 128 tokens, checked here)."""
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(PROMPT, max_new_tokens=new, do_sample=False)
        seconds = time.perf_counter() - start
    made = out.shape[1] - PROMPT.shape[1]
    if made != new:
        raise RuntimeError(f"generate() stopped after {made} of {new} tokens: use a smaller --new")
    return seconds / new


def ttft(model: Any) -> float:
    """Seconds of one greedy generate() of a single new token (prefill + first token)."""
    with torch.no_grad():
        start = time.perf_counter()
        model.generate(PROMPT, max_new_tokens=1, do_sample=False)
        return time.perf_counter() - start


def first_token(
    model: Any, rows: dict[str, list[float]], procs: ServerProcs | None = None
) -> float:
    """`ttft` with its parts timed: appends each part's ms of the first token to `rows`
    (the swarm's: also each server's step time, from its /metrics)."""
    before = procs.server_seconds() if procs is not None else []
    TIMERS.total.clear()
    TIMERS.on = True
    try:
        seconds = ttft(model)
    finally:
        TIMERS.on = False
    for label, part in sorted(TIMERS.total.items()):
        rows[label].append(part * 1e3)
    if procs is not None:
        procs.server_rows(before, 1, rows)
    rows["generate() + client glue (rest)"].append((seconds - sum(TIMERS.total.values())) * 1e3)
    return seconds


def run_swarm(model: Any, procs: ServerProcs, new: int, rows: dict[str, list[float]]) -> float:
    """One timed generate() on the swarm; appends per-token ms of each part to `rows`."""
    before = procs.server_seconds()
    TIMERS.total.clear()
    TIMERS.on = True
    try:
        per_token = timed_generate(model, new)
    finally:
        TIMERS.on = False
    accounted = 0.0
    for label, seconds in sorted(TIMERS.total.items()):
        rows[label].append(seconds / new * 1e3)
        accounted += seconds
    procs.server_rows(before, new, rows)
    rows["generate() + client glue (rest)"].append((per_token * new - accounted) / new * 1e3)
    return per_token


def run_local(model: Any, new: int, rows: dict[str, list[float]]) -> float:
    """One timed local generate(); appends per-token ms of its backbone, head and the rest."""
    TIMERS.total.clear()
    TIMERS.on = True
    try:
        per_token = timed_generate(model, new)
    finally:
        TIMERS.on = False
    for label, seconds in sorted(TIMERS.total.items()):
        rows[label].append(seconds / new * 1e3)
    rest = per_token * new - sum(TIMERS.total.values())
    rows["generate() rest"].append(rest / new * 1e3)
    return per_token


def instrument_local(model: Any) -> None:
    model.model.forward = TIMERS.wrap(
        lambda a: "embed + 30 blocks + final norm", model.model.forward
    )
    model.lm_head.forward = TIMERS.wrap(lambda a: "lm_head", model.lm_head.forward)


def instrument_head(model: Any) -> None:
    head = model.head
    head.embed = TIMERS.wrap(lambda a: "client embed", head.embed)
    head.project = TIMERS.wrap(lambda a: "client lm_head", head.project)
    head.norm.forward = TIMERS.wrap(lambda a: "client final norm", head.norm.forward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--parts", default="2,3", help="server counts to bench, e.g. 2,3")
    parser.add_argument("--relay", action="store_true",
                        help="the client relays every step (default: server-to-server push)")  # fmt: skip
    parser.add_argument(
        "--compile",
        default=None,
        choices=["auto", "on", "off"],
        help="the servers' --compile (how decode steps run; default: theirs)",
    )
    parser.add_argument("--row_kernel", default="auto", choices=["auto", "off"],
                        help="the servers' and the client's few-row products: DRIFT's C "
                        "kernel (auto, their default) or torch's BLAS (off)")  # fmt: skip
    parser.add_argument(
        "--local_kernel",
        action="store_true",
        help="also local transformers with DRIFT's row kernel in its linears",
    )
    parser.add_argument("--threads", default="default",
                        help="compute threads per process: 'default' (none set: as users run "
                        "it) or a number (default: default)")  # fmt: skip
    args = parser.parse_args()
    if args.threads == "default" and os.environ.get("OMP_NUM_THREADS"):
        args.threads = os.environ["OMP_NUM_THREADS"]  # what this shell asks for, everywhere
    if args.threads != "default":
        torch.set_num_threads(int(args.threads))
    directory = open_checkpoint(args.model).path
    local = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    locals_ = {"local": local}
    kernel = None
    if args.local_kernel:
        kernel, why = RowKernel.build(resolve_cache_dir(None))
        if kernel is None:
            raise SystemExit(f"--local_kernel: {why}")
        locals_["local+kernel"] = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32
        ).eval()
        kernel.install(locals_["local+kernel"])
    n = local.config.num_hidden_layers
    parts = [int(p) for p in args.parts.split(",")]
    swarms: dict[int, tuple[ServerProcs, Any]] = {}
    rates: dict[str, list[float]] = defaultdict(list)
    firsts: dict[str, list[float]] = defaultdict(list)  # time to first token, seconds
    rows: dict[int, dict[str, list[float]]] = {p: defaultdict(list) for p in [0, *parts]}
    first_rows: dict[int, dict[str, list[float]]] = {p: defaultdict(list) for p in [0, *parts]}
    kernel_rows: dict[str, list[float]] = defaultdict(list)  # local+kernel's parts
    for lm in locals_.values():
        instrument_local(lm)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for p in parts:
                bounds = [n * i // p for i in range(p + 1)]
                procs = ServerProcs(
                    str(directory),
                    list(zip(bounds, bounds[1:], strict=False)),
                    Path(tmp),
                    extra=(
                        ("--row_kernel", args.row_kernel)
                        + (() if args.compile is None else ("--compile", args.compile))
                    ),
                    threads=args.threads,
                )
                model = AutoDistributedModelForCausalLM.from_pretrained(
                    directory, initial_peers=procs.token,
                    client_config=ClientConfig(push=not args.relay,
                                               row_kernel=args.row_kernel == "auto"),
                )  # fmt: skip
                swarms[p] = (procs, model)
                wait_covered(model, n)
                instrument_head(model)
                model.generate(PROMPT, max_new_tokens=4, do_sample=False)  # warm up
            with activated(kernel):
                for lm in locals_.values():
                    lm.generate(PROMPT, max_new_tokens=4, do_sample=False)
            for rep in range(args.reps):
                for _ in range(FIRSTS_PER_REP):  # a prompt's pass swings more than a token's
                    firsts["local"].append(first_token(local, first_rows[0]))
                    if args.local_kernel:
                        with activated(kernel):  # as generate() in the SDK
                            firsts["local+kernel"].append(
                                first_token(locals_["local+kernel"], defaultdict(list))
                            )
                    for p, (procs, model) in swarms.items():
                        firsts[f"{p} servers"].append(first_token(model, first_rows[p], procs))
                rates["local"].append(1 / run_local(local, args.new, rows[0]))
                if args.local_kernel:
                    with activated(kernel):
                        rates["local+kernel"].append(
                            1 / run_local(locals_["local+kernel"], args.new, kernel_rows)
                        )
                for p, (procs, model) in swarms.items():
                    rates[f"{p} servers"].append(1 / run_swarm(model, procs, args.new, rows[p]))
                print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rates.items()),
                      flush=True)  # fmt: skip
        finally:
            for procs, model in swarms.values():
                model.close()
                procs.stop()
    report(args, rates, rows, firsts, first_rows, kernel_rows)


def report(args: Any, rates: dict[str, list[float]], rows: dict[int, dict[str, list[float]]],
           firsts: dict[str, list[float]], first_rows: dict[int, dict[str, list[float]]],
           kernel_rows: dict[str, list[float]]) -> None:  # fmt: skip
    med = {k: statistics.median(v) for k, v in rates.items()}
    threads = "torch's default threads" if args.threads == "default" else (
        f"{args.threads} compute thread(s) per process")  # fmt: skip
    print(f"\n{args.model}, {args.new} new tokens after a {PROMPT.shape[1]}-token prompt, "
          f"medians of {args.reps} interleaved runs, {threads}, servers' "
          f"--compile {args.compile or 'default'}, swarm's --row_kernel {args.row_kernel}")  # fmt: skip
    first = {k: statistics.median(v) * 1e3 for k, v in firsts.items()}
    paired = {k: statistics.median(a / b for a, b in zip(v, firsts["local"], strict=True))
              for k, v in firsts.items() if k != "local"}  # fmt: skip
    same_products = {}  # each swarm's first token against local+kernel's
    if args.local_kernel:
        same_products = {k: statistics.median(
            a / b for a, b in zip(v, firsts["local+kernel"], strict=True))
            for k, v in firsts.items() if k.endswith("servers")}  # fmt: skip
    print(f"time to first token (ms, medians of {len(firsts['local'])}, each swarm one right "
          "after a local one): " + ", ".join(
        f"{k} {v:.0f}" + ("" if k == "local" else f" ({v / first['local']:.2f}x local; median "
                          f"of paired ratios {paired[k]:.2f}x)")
        for k, v in first.items()))  # fmt: skip
    for p, parts in first_rows.items():
        print("  first token, " + ("local" if p == 0 else f"{p} servers") + " (medians, ms):")
        for label, values in parts.items():
            print(f"    {label:<42} {statistics.median(values):7.2f} ms")
    print(f"local transformers: {med['local']:6.2f} tokens/s  ({1e3 / med['local']:.1f} ms/token)")
    for label, values in rows.pop(0).items():
        print(f"    {label:<42} {statistics.median(values):7.2f} ms/token")
    if args.local_kernel:
        rate = med["local+kernel"]
        print(f"local transformers + DRIFT's row kernel: {rate:6.2f} tokens/s  "
              f"({1e3 / rate:.1f} ms/token)")  # fmt: skip
        for label, values in kernel_rows.items():
            print(f"    {label:<42} {statistics.median(values):7.2f} ms/token")
    for p, parts in rows.items():
        rate = med[f"{p} servers"]
        paired = [r / lo for r, lo in zip(rates[f"{p} servers"], rates["local"], strict=True)]
        print(f"swarm, {p} servers: {rate:6.2f} tokens/s  ({1e3 / rate:.1f} ms/token)  "
              f"ratio {rate / med['local']:.2f}x; median of per-rep ratios "
              f"{statistics.median(paired):.2f}x (min {min(paired):.2f}, max {max(paired):.2f})")  # fmt: skip
        if args.local_kernel:
            same = [r / lo for r, lo in
                    zip(rates[f"{p} servers"], rates["local+kernel"], strict=True)]  # fmt: skip
            print(f"    against local+kernel (the same products): {rate / med['local+kernel']:.2f}x; "
                  f"median of per-rep ratios {statistics.median(same):.2f}x; time to first "
                  f"token {first[f'{p} servers'] / first['local+kernel']:.2f}x (median of paired "
                  f"ratios {same_products[f'{p} servers']:.2f}x)")  # fmt: skip
        for label, values in parts.items():
            print(f"    {label:<42} {statistics.median(values):7.2f} ms/token")


if __name__ == "__main__":
    main()
