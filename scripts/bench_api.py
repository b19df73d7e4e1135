"""Throughput of `drift api` under 1, 4 and 8 concurrent clients: requests/s and tokens/s.

Either point it at a running server (--url http://host:port --api_key KEY --model ID), or
give --local MODEL (alias, dir or .gguf) to serve it in-process on 127.0.0.1 with a local
transformers model (no swarm), or --swarm MODEL to serve it over a real loopback swarm (two
in-process block servers splitting the blocks in halves, tests/server/harness.py). Each
client sends --requests completions one after another. --max_batch 1 8 repeats the run
with batching off (1) and on (up to 8 requests per batch), for --local and --swarm.
--arrivals 10 compares clients arriving together with clients arriving at random times
over 10 s (streamed: tokens/s and each request's time to first token).

    PYTHONPATH=. python scripts/bench_api.py --local smollm2 --max_tokens 32
    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/bench_api.py --swarm smollm2 --max_batch 1 8
    python scripts/bench_api.py --url http://127.0.0.1:8000 --api_key sk-... --model smollm2
    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/bench_api.py --swarm smollm2 --max_batch 8 \
        --clients 8 --requests 1 --arrivals 10

--vs_sdk [--reps N --new N]: one user through `drift api` with its defaults against the
SDK's generate() on the same swarm of real processes (scripts/bench_api_sdk.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp


async def _client(http: aiohttp.ClientSession, url: str, body: dict, requests: int) -> int:
    tokens = 0
    for _ in range(requests):
        async with http.post(f"{url}/v1/completions", json=body) as r:
            data = await r.json()
            if r.status != 200:
                raise SystemExit(f"HTTP {r.status}: {data}")
            tokens += data["usage"]["completion_tokens"]
    return tokens


async def _streamed(http: aiohttp.ClientSession, url: str, body: dict, requests: int,
                    delay: float) -> tuple[int, list[float]]:  # fmt: skip
    """After `delay` seconds, `requests` streamed completions: (text chunks received, each
    one's time to its first chunk)."""
    await asyncio.sleep(delay)
    chunks, ttfts = 0, []
    for _ in range(requests):
        start, first = time.perf_counter(), None
        async with http.post(f"{url}/v1/completions", json=dict(body, stream=True)) as r:
            if r.status != 200:
                raise SystemExit(f"HTTP {r.status}: {await r.text()}")
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    first = first or time.perf_counter() - start
                    chunks += 1
        ttfts.append(first or time.perf_counter() - start)
    return chunks, ttfts


async def bench_arrivals(url: str, key: str, model: str, args: argparse.Namespace) -> None:
    """Clients arriving together vs at random times over --arrivals seconds (seeded)."""
    body = {"model": model, "prompt": args.prompt, "max_tokens": args.max_tokens,
            "temperature": 0}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    rng = random.Random(0)
    async with aiohttp.ClientSession(headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=3600)) as http:  # fmt: skip
        await _streamed(http, url, dict(body, max_tokens=2), 1, 0.0)  # warm-up
        print(f"{'clients':>7} {'arrivals':>12} {'seconds':>8} {'tokens/s':>9} "
              f"{'TTFT median':>12} {'TTFT max':>9}")  # fmt: skip
        for clients in args.clients:
            rates = {}
            for label, spread in (("together", 0.0), (f"over {args.arrivals:g} s", args.arrivals)):
                delays = sorted(rng.uniform(0, spread) for _ in range(clients))
                start = time.perf_counter()
                results = await asyncio.gather(
                    *(_streamed(http, url, body, args.requests, d) for d in delays))  # fmt: skip
                seconds = time.perf_counter() - start
                ttfts = sorted(t for _, ts in results for t in ts)
                rates[label] = sum(n for n, _ in results) / seconds
                print(f"{clients:>7} {label:>12} {seconds:>8.2f} {rates[label]:>9.1f} "
                      f"{ttfts[len(ttfts) // 2] * 1e3:>9.0f} ms {ttfts[-1] * 1e3:>6.0f} ms",
                      flush=True)  # fmt: skip


async def bench(url: str, key: str, model: str, args: argparse.Namespace) -> None:
    if args.arrivals:
        await bench_arrivals(url, key, model, args)
        return
    body = {"model": model, "prompt": args.prompt, "max_tokens": args.max_tokens,
            "temperature": 0}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        await _client(http, url, dict(body, max_tokens=2), 1)  # warm-up
        print(f"{'clients':>7} {'requests':>8} {'seconds':>8} {'req/s':>7} {'tokens/s':>9}")
        for clients in args.clients:
            start = time.perf_counter()
            counts = await asyncio.gather(
                *(_client(http, url, body, args.requests) for _ in range(clients))
            )
            seconds = time.perf_counter() - start
            n = clients * args.requests
            print(f"{clients:>7} {n:>8} {seconds:>8.2f} {n / seconds:>7.2f} "
                  f"{sum(counts) / seconds:>9.1f}", flush=True)  # fmt: skip


async def bench_local(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drift.api.engine import CausalLMEngine
    from drift.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint(args.local)
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    engine = CausalLMEngine(model, AutoTokenizer.from_pretrained(ckpt.path), model_id="bench")
    await serve_and_bench(engine, args)


async def bench_swarm(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from drift.api.swarm import swarm_engine
    from drift.client import AutoDistributedModelForCausalLM
    from drift.models.checkpoint import open_checkpoint
    from tests.client.swarms import start_swarm, stop_swarm

    ckpt = open_checkpoint(args.swarm)
    half = ckpt.config.num_hidden_layers // 2
    swarm = await start_swarm(ckpt.path, [(0, half), (half, ckpt.config.num_hidden_layers)])
    model = None
    try:
        model = await asyncio.to_thread(
            AutoDistributedModelForCausalLM.from_pretrained, ckpt.path, initial_peers=swarm.token
        )
        engine = swarm_engine(model, AutoTokenizer.from_pretrained(ckpt.path), model_id="bench")
        await serve_and_bench(engine, args)
    finally:
        if model is not None:
            await asyncio.to_thread(model.close)
        await stop_swarm(swarm)


async def serve_and_bench(engine, args: argparse.Namespace) -> None:
    """Serve `engine` on 127.0.0.1 once per --max_batch value and bench each."""
    from aiohttp import web

    from drift.api.app import ApiConfig, build_api_app
    from drift.api.service import ServiceConfig

    for max_batch in args.max_batch:
        service = ServiceConfig(max_concurrent=max(args.clients), queue_size=64,
                                max_batch=max_batch)  # fmt: skip
        app = build_api_app(engine, ApiConfig(api_keys=("bench",), service=service))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(f"max_batch={max_batch} ({'batching on' if max_batch > 1 else 'batching off'})")
        try:
            await bench(f"http://127.0.0.1:{runner.addresses[0][1]}", "bench", "bench", args)
        finally:
            await runner.cleanup()


def main() -> None:
    if "--vs_sdk" in sys.argv:  # one user, drift api vs the SDK: scripts/bench_api_sdk.py
        sys.argv.remove("--vs_sdk")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_api_sdk import main as vs_sdk

        return vs_sdk()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running `drift api` (http://host:port)")
    p.add_argument("--api_key", default="", help="its API key")
    p.add_argument("--model", default="", help="the model id it serves")
    p.add_argument("--local", help="serve this model in-process instead (alias, dir, .gguf)")
    p.add_argument("--swarm", help="serve this model in-process over a loopback swarm of two "
                   "block servers (alias, dir, .gguf)")  # fmt: skip
    p.add_argument("--max_batch", type=int, nargs="+", default=[1],
                   help="with --local/--swarm: one run per value (1 = no batching)")  # fmt: skip
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--requests", type=int, default=2, help="requests per client")
    p.add_argument("--max_tokens", type=int, default=32)
    p.add_argument("--prompt", default="The history of the city of Paris")
    p.add_argument("--arrivals", type=float, default=0.0,
                   help="also run each client count with the clients arriving at random "
                        "times over this many seconds (streamed: time to first token)")  # fmt: skip
    args = p.parse_args()
    if args.swarm:
        asyncio.run(bench_swarm(args))
    elif args.local:
        asyncio.run(bench_local(args))
    elif args.url:
        asyncio.run(bench(args.url.rstrip("/"), args.api_key, args.model, args))
    else:
        p.error("give --url (a running server), --local MODEL or --swarm MODEL")


if __name__ == "__main__":
    main()
