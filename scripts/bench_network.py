"""Decode steps over an emulated slow network: relay vs server-to-server push, activation
compression, prompt lookup.

Three `drift server` processes for SmolLM2 (float32) on 127.0.0.1, each behind a delaying,
rate-limiting TCP proxy that it announces as its address, so every connection to a server
(from the client and from the other servers: push links, gossip) crosses one emulated link:
`--rtts` milliseconds of round trip (half each way) and `--rate_mbit` each way. This kernel
has no netem qdisc, so the delay lives in the proxy (asyncio, in a process of its own),
not in `tc`; everything stays on loopback.

Per RTT, interleaved `--reps` times: one session, a 5-token prefill, then `--new` single-
token steps, relayed (client -> each server in turn) and pushed (client -> first -> ... ->
last -> client); the step latency (client side, median), the servers' summed step time
(their /metrics, the same steps), the links' part (step less compute, also in RTTs: n for
relay, (n+1)/2 for push), push's bound: (n+1)/2 RTT + compute, + 10%, and the session's
first step (opening it on every server, then the prefill: a time to first token) and its
close (every server's answer to it). Then,
without delay, each wire form's bytes per step and its logit error against float32 on the
wire (same greedy tokens fed to both, `--new` steps), and at the largest RTT the tokens/s of
greedy generate() with and without prompt lookup on a prompt that repeats a paragraph.

Defaults are what users run: TLS on (`--tls off`: plain HTTP), no thread counts set in any
process (or this shell's OMP_NUM_THREADS, for every process; `--threads N`: N each).

    .venv/bin/python scripts/bench_network.py --rtts 0,10,50 --new 8
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import re
import socket
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
from transformers import AutoConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.client.loading import load_tokenizer  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.wire.compress import WIRE_FORMS, pack  # noqa: E402
from drift.wire.frames import encode_frame  # noqa: E402
from drift.wire.messages import StepRequest  # noqa: E402

PROMPT = torch.tensor([[1, 504, 2365, 3290, 253]])
PARAGRAPH = ("The quick brown fox jumps over the lazy dog near the quiet river bank, while "
             "the farmer counts his sheep and the baker opens the shop on the corner.")  # fmt: skip


class Link:
    """One emulated link in front of a server: listen port -> target port, delay and rate."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        # shared with the links' own process: set here, read there
        self._one_way = multiprocessing.Value("d", 0.0, lock=False)
        self._rate = multiprocessing.Value("d", 0.0, lock=False)  # bits/s, 0: unlimited

    @property
    def one_way_s(self) -> float:
        return float(self._one_way.value)

    @property
    def rate_bps(self) -> float:
        return float(self._rate.value)

    def set(self, one_way_s: float, rate_bps: float) -> None:
        self._one_way.value, self._rate.value = one_way_s, rate_bps

    async def serve(self) -> None:
        server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        await server.serve_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk delivered one_way_s after it arrived, and no faster
        than rate_bps."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def pump() -> None:
            try:
                while data := await reader.read(1 << 16):
                    queue.put_nowait((loop.time(), data))
            except (ConnectionError, OSError):
                pass
            queue.put_nowait((loop.time(), b""))

        task = asyncio.create_task(pump())
        free_at = 0.0
        try:
            while True:
                arrived, data = await queue.get()
                if not data:
                    break
                due = arrived + self.one_way_s
                if self.rate_bps:
                    free_at = max(free_at, due) + len(data) * 8 / self.rate_bps
                    due = free_at
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            task.cancel()
            writer.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_links(links: list[Link]) -> multiprocessing.Process:
    """The links, served by a process of their own (not competing with the client for the
    GIL)."""
    proc = multiprocessing.get_context("fork").Process(target=_serve_links, args=(links,),
                                                       daemon=True)  # fmt: skip
    proc.start()
    return proc


def _serve_links(links: list[Link]) -> None:
    async def serve() -> None:
        await asyncio.gather(*(link.serve() for link in links))

    asyncio.run(serve())


class Servers:
    """`drift server` processes on fixed ports, each announcing its link's port."""

    def __init__(self, model: str, spans: list[tuple[int, int]], tmp: Path, *, tls: bool = True,
                 threads: str = "default") -> None:  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports = [free_port() for _ in spans]
        self.links = [Link(port) for port in self.ports]
        self.link_proc = start_links(self.links)
        self.token = ""
        self.tls = tls
        env = {k: v for k, v in os.environ.items()
               if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}  # fmt: skip
        if threads != "default":
            env |= {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        for (start, end), port, link in zip(spans, self.ports, self.links, strict=True):
            log = tmp / f"server-{start}-{end}.log"
            cmd = [sys.executable, "-m", "drift.cli", "server", model, "--block_indices",
                   f"{start}:{end}", "--host_maddrs", f"/ip4/127.0.0.1/tcp/{port}",
                   "--announce_maddrs", f"/ip4/127.0.0.1/tcp/{link.port}",
                   "--throughput", "100", "--cache_dir", str(tmp)]  # fmt: skip
            if not tls:
                cmd.append("--plain_http")
            if self.token:
                cmd += ["--initial_peers", self.token]
            with open(log, "wb") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, env=env))
            text = self._wait_for(log, r"join token: (\S+)")
            self.token = self.token or re.search(r"join token: (\S+)", text).group(1)  # type: ignore[union-attr]

    def _wait_for(self, log: Path, pattern: str, timeout: float = 240) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if re.search(pattern, text):
                return text
            if self.procs[-1].poll() is not None:
                raise RuntimeError(f"server exited:\n{text}")
            time.sleep(0.2)
        raise TimeoutError(f"no {pattern!r} in {log}")

    def _get(self, port: int, path: str) -> str:
        """GET on a server's own port (over TLS its certificate is bound to its peer id, not
        to 127.0.0.1: read here without checking it)."""
        import ssl

        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}{path}"
        with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
            return resp.read().decode()

    def wait_all_listed(self, timeout: float = 120) -> None:
        """Until every server lists the two others (push needs its next hop in its table)."""
        deadline = time.monotonic() + timeout
        while True:
            tables = [json.loads(self._get(port, "/swarm"))["records"] for port in self.ports]
            if all(sum(r.get("end_block") is not None for r in records) >= len(self.ports)
                   for records in tables):  # fmt: skip
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the servers do not list each other")
            time.sleep(0.5)

    def step_seconds(self) -> float:
        """Summed step latency of every server so far (their /metrics)."""
        total = 0.0
        for port in self.ports:
            m = re.search(r"^drift_step_latency_seconds_sum (\S+)", self._get(port, "/metrics"),
                          re.M)  # fmt: skip
            total += float(m.group(1)) if m else 0.0
        return total

    def set_link(self, rtt_ms: float, rate_mbit: float) -> None:
        for link in self.links:
            link.set(rtt_ms / 2e3, rate_mbit * 1e6)

    def stop(self) -> None:
        self.link_proc.kill()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def configure(model: Any, **fields: Any) -> None:
    """The client's settings for the next sessions (each run opens its own)."""
    model.client.config = dataclasses.replace(model.client.config, **fields)


def decode_steps(model: Any, servers: Servers, new: int) -> tuple[float, float, float, float]:
    """(median client-side step seconds, servers' step seconds per step) of `new` one-token
    steps after a prefill, in one session; the seconds of its first step (opening the
    session on every server, then the prefill) and of closing it."""
    embed = model.get_input_embeddings()
    with torch.no_grad():
        session = model.open_session(max_length=PROMPT.shape[1] + new + 1)
        try:
            prompt = embed(PROMPT)
            started = time.perf_counter()
            session.step(prompt)
            first = time.perf_counter() - started
            before, times = servers.step_seconds(), []
            for i in range(new):
                hidden = embed(PROMPT[:, i % PROMPT.shape[1]][:, None])
                started = time.perf_counter()
                session.step(hidden)
                times.append(time.perf_counter() - started)
            compute = (servers.step_seconds() - before) / new
        finally:
            started = time.perf_counter()
            session.close()
            closed = time.perf_counter() - started
    return statistics.median(times), compute, first, closed


def teacher_forced(model: Any, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Logits [steps, vocab] of feeding `ids` token by token after the prompt, in a session."""
    out_logits = []
    with torch.no_grad(), model.inference_session(max_length=ids.shape[1] + 1):
        out = model(ids[:, :prompt_len], use_cache=True)
        out_logits.append(out.logits[0, -1])
        for pos in range(prompt_len, ids.shape[1]):
            out = model(ids[:, pos : pos + 1], cache=out.cache, use_cache=True)
            out_logits.append(out.logits[0, -1])
    return torch.stack(out_logits)


def step_bytes(hidden_size: int, form: str | None) -> int:
    """Bytes of one single-token step frame in `form`."""
    params, tensors = StepRequest(1, 10, torch.randn(1, 1, hidden_size)).to_wire()
    return len(encode_frame(params, pack(params, tensors, form)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rtts", default="0,10,50", help="round trips to emulate, in ms")
    parser.add_argument("--rate_mbit", type=float, default=100.0)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--new", type=int, default=8, help="decode steps per run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--lookup_new", type=int, default=24, help="tokens for prompt lookup (0: skip that section)"
    )
    parser.add_argument(
        "--tls",
        default="on",
        choices=["on", "off"],
        help="servers over TLS (on, as drift server runs by default) or not",
    )
    parser.add_argument(
        "--threads",
        default="default",
        help="compute threads per process: 'default' (none set) or a number",
    )
    args = parser.parse_args()
    if args.threads == "default" and os.environ.get("OMP_NUM_THREADS"):
        args.threads = os.environ["OMP_NUM_THREADS"]  # what this shell asks for, everywhere
    if args.threads != "default":
        torch.set_num_threads(int(args.threads))
    rtts = [float(r) for r in args.rtts.split(",")]
    directory = open_checkpoint(args.model).path
    with tempfile.TemporaryDirectory() as tmp:
        n, p = AutoConfig.from_pretrained(directory).num_hidden_layers, args.servers
        bounds = [n * i // p for i in range(p + 1)]
        servers = Servers(str(directory), list(zip(bounds, bounds[1:], strict=False)), Path(tmp),
                          tls=args.tls == "on", threads=args.threads)  # fmt: skip
        model = None
        try:
            servers.wait_all_listed()
            model = AutoDistributedModelForCausalLM.from_pretrained(
                directory, initial_peers=servers.token
            )
            run(args, rtts, servers, model, directory)
        finally:
            if model is not None:
                model.close()
            servers.stop()


def run(args: Any, rtts: list[float], servers: Servers, model: Any, directory: Any) -> None:
    n = args.servers
    decode_steps(model, servers, 2)  # warm up (connections, push links)
    print(f"{args.model}, {n} servers, {args.new} decode steps per run after a "
          f"{PROMPT.shape[1]}-token prefill, {args.rate_mbit:g} Mbit/s each way, medians of "
          f"{args.reps} interleaved runs", flush=True)  # fmt: skip
    print(f"{'RTT':>6} {'mode':<14} {'step ms':>8} {'compute':>8} {'links':>6} {'RTTs':>5} "
          f"{'vs relay':>9} {'bound':>8}    {'open+prefill ms':>15} {'close ms':>8}")  # fmt: skip
    modes = {"relay": {"push": False}, "push": {"push": True},
             "push+float16": {"push": True, "wire_dtype": "float16"},
             "push+int8": {"push": True, "wire_dtype": "int8"}}  # fmt: skip
    for rtt in rtts:
        servers.set_link(rtt, args.rate_mbit)
        steps: dict[str, list[float]] = defaultdict(list)
        compute: dict[str, list[float]] = defaultdict(list)
        firsts: dict[str, list[float]] = defaultdict(list)
        closes: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.reps):
            for mode, fields in modes.items():
                configure(model, **{"wire_dtype": None, **fields})
                step_s, compute_s, first_s, close_s = decode_steps(model, servers, args.new)
                firsts[mode].append(first_s)
                closes[mode].append(close_s)
                steps[mode].append(step_s)
                compute[mode].append(compute_s)
        relay = statistics.median(steps["relay"])
        for mode in modes:
            step_ms = statistics.median(steps[mode]) * 1e3
            c_ms = statistics.median(compute[mode]) * 1e3
            # what the links cost: the step less the servers' compute, in RTTs
            links = (
                statistics.median(s - c for s, c in zip(steps[mode], compute[mode], strict=True))
                * 1e3
            )
            in_rtts = f"{links / rtt:5.2f}" if rtt else f"{'-':>5}"
            bound = (((n + 1) / 2 * rtt + c_ms) * 1.1) if mode.startswith("push") else None
            flag = f"{'':13}" if bound is None else (
                f"{bound:8.1f} {'ok  ' if step_ms <= bound else 'OVER'}")  # fmt: skip
            first_ms = statistics.median(firsts[mode]) * 1e3
            close_ms = statistics.median(closes[mode]) * 1e3
            print(f"{rtt:5.0f}ms {mode:<14} {step_ms:8.1f} {c_ms:8.1f} {links:6.1f} {in_rtts} "
                  f"{step_ms / relay / 1e3:8.2f}x {flag} {first_ms:15.1f} {close_ms:8.1f}", flush=True)  # fmt: skip
    servers.set_link(0, 0)
    compression(args, model)
    if args.lookup_new > 0:  # 0: no prompt-lookup section
        lookup(args, rtts[-1], servers, model, directory)


def compression(args: Any, model: Any) -> None:
    hidden = model.config.hidden_size
    configure(model, push=True, wire_dtype=None)
    with torch.no_grad():
        ids = model.generate(PROMPT, max_new_tokens=args.new, do_sample=False)
    ref = teacher_forced(model, ids, PROMPT.shape[1])
    print(f"\nwire forms (one-token step frame, logits over {ref.shape[0]} positions of the "
          "same greedy tokens, float32 on the wire as reference)")  # fmt: skip
    print(
        f"{'form':<10} {'bytes/step':>10} {'max |dlogit|':>13} {'mean |dlogit|':>14} {'top-1':>6}"
    )
    print(f"{'float32':<10} {step_bytes(hidden, None):>10} {0.0:>13.4f} {0.0:>14.4f} {1.0:>6.0%}")
    for form in WIRE_FORMS:
        configure(model, wire_dtype=form)
        got = teacher_forced(model, ids, PROMPT.shape[1])
        err = (got - ref).abs()
        agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(f"{form:<10} {step_bytes(hidden, form):>10} {err.max().item():>13.4f} "
              f"{err.mean().item():>14.4f} {agree:>6.0%}", flush=True)  # fmt: skip
    configure(model, wire_dtype=None)


def lookup(args: Any, rtt: float, servers: Servers, model: Any, directory: Any) -> None:
    servers.set_link(rtt, args.rate_mbit)
    tokenizer = load_tokenizer(str(directory))
    text = f"{PARAGRAPH}\n\n{PARAGRAPH}\n\n{PARAGRAPH}\n\n"  # the model goes on repeating it
    ids = tokenizer(text, return_tensors="pt").input_ids
    rates: dict[str, list[float]] = defaultdict(list)
    outs: dict[str, torch.Tensor] = {}
    configure(model, push=True, wire_dtype=None)
    for _ in range(args.reps):
        for name, kw in (("greedy", {}), ("prompt lookup", {"prompt_lookup_num_tokens": 10})):
            with torch.no_grad():
                started = time.perf_counter()
                out = model.generate(ids, max_new_tokens=args.lookup_new,
                                     min_new_tokens=args.lookup_new, do_sample=False, **kw)  # fmt: skip
                rates[name].append(args.lookup_new / (time.perf_counter() - started))
            outs[name] = out
    same = torch.equal(outs["greedy"], outs["prompt lookup"])
    base = statistics.median(rates["greedy"])
    print(f"\nprompt lookup at {rtt:g} ms RTT, push on, {args.lookup_new} new tokens of a prompt "
          f"that repeats a paragraph ({ids.shape[1]} tokens); identical output: {same}")  # fmt: skip
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:<14} {rate:7.2f} tokens/s  {rate / base:5.2f}x")


if __name__ == "__main__":
    main()
