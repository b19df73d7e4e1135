"""What TLS costs per step: the same span served over plain HTTP and over TLS, same run.

Two real servers of a SmolLM2-sized span (random weights from SmolLM2's config, or the real
checkpoint with --model <dir>) on 127.0.0.1, one plain and one TLS (certificate bound to its
identity, checked by the client against the peer id as the SDK does). Each rep: a session
on each with a prompt, then N decode steps alternating plain / TLS step by step, then a
/forward of a long input on each; prints medians and the TLS / plain ratio.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python scripts/bench_tls.py --steps 40 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.client.calls import forward  # noqa: E402
from drift.client.config import ClientConfig  # noqa: E402
from drift.client.routing import Hop  # noqa: E402
from drift.client.transport import SpanSocket  # noqa: E402
from drift.wire import messages as m  # noqa: E402
from scripts.bench_server import SMOLLM2_CONFIG  # noqa: E402
from tests.server.harness import RunningServer, start_block_server  # noqa: E402


async def open_session(http: aiohttp.ClientSession, server: RunningServer, prompt: int,
                       steps: int) -> SpanSocket:  # fmt: skip
    """A session on `server` (over the SDK's transport, TLS checked as the SDK checks it)
    holding a prompt of `prompt` tokens."""
    b = server.server.backend
    hop = Hop(server.node.peer_id, server.node.addrs[0], b.start_block, b.end_block)
    opened = m.OpenSession(b.fingerprint, b.start_block, b.end_block, prompt + steps, 1,
                           "float32")  # fmt: skip
    sock = await SpanSocket.open(http, hop, opened, ClientConfig())
    await sock.step(torch.randn(1, prompt, b.hidden_size), 0)
    return sock


async def paired_steps(http: aiohttp.ClientSession, servers: dict[str, RunningServer],
                       prompt: int, steps: int) -> dict[str, list[float]]:  # fmt: skip
    """Seconds of each decode step, plain and TLS alternating step by step (same load)."""
    socks = {name: await open_session(http, s, prompt, steps) for name, s in servers.items()}
    times: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for i in range(steps):
            for name, sock in socks.items():
                hidden = torch.randn(1, 1, servers[name].server.backend.hidden_size)
                t0 = time.perf_counter()
                await sock.step(hidden, prompt + i)
                times[name].append(time.perf_counter() - t0)
    finally:
        for sock in socks.values():
            await sock.close()
    return times


async def one_forward(http: aiohttp.ClientSession, server: RunningServer, tokens: int) -> float:
    b = server.server.backend
    hop = Hop(server.node.peer_id, server.node.addrs[0], b.start_block, b.end_block)
    hidden = torch.randn(1, tokens, b.hidden_size)
    t0 = time.perf_counter()
    await forward(http, hop, b.fingerprint, hidden, ClientConfig())
    return time.perf_counter() - t0


async def bench(model: Path, blocks: int, prompt: int, steps: int, reps: int,
                tokens: int) -> None:  # fmt: skip
    servers = {
        "plain": await start_block_server(model, 0, blocks, inference_max_length=4096),
        "tls": await start_block_server(model, 0, blocks, inference_max_length=4096,
                                        node={"tls": True}),
    }  # fmt: skip
    assert servers["tls"].node.addrs[0].startswith("https://")
    step: dict[str, list[float]] = {k: [] for k in servers}
    fwd: dict[str, list[float]] = {k: [] for k in servers}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(reps):
                for name, times in (await paired_steps(http, servers, prompt, steps)).items():
                    step[name].append(statistics.median(times))
                for name, server in servers.items():  # interleaved: the same load for both
                    fwd[name].append(await one_forward(http, server, tokens))
    finally:
        for server in servers.values():
            await server.stop()
    print(f"{blocks} blocks, prompt {prompt}, {steps} decode steps x {reps} reps (medians)")
    for label, data in (("decode step", step), (f"forward of {tokens} tokens", fwd)):
        plain, tls = statistics.median(data["plain"]), statistics.median(data["tls"])
        print(f"  {label:24s} plain {plain * 1e3:8.2f} ms   TLS {tls * 1e3:8.2f} ms   "
              f"TLS/plain {tls / plain:.3f}")  # fmt: skip


def random_span_model(directory: Path, blocks: int) -> Path:
    """SmolLM2's shape with random weights and only `blocks` blocks."""
    config = AutoConfig.for_model("llama", **{**SMOLLM2_CONFIG, "num_hidden_layers": blocks})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint dir (default: random SmolLM2 shape)")
    p.add_argument("--blocks", type=int, default=2, help="blocks served (default: 2)")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tokens", type=int, default=512, help="tokens of the /forward (default 512)")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = (Path(args.model) if args.model
                 else random_span_model(Path(tmp) / "smollm2-random", args.blocks))  # fmt: skip
        asyncio.run(bench(model, args.blocks, args.prompt, args.steps, args.reps, args.tokens))


if __name__ == "__main__":
    main()
