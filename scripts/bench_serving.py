"""Load generator for any OpenAI-compatible server (`drift api`, llama-server, vLLM): streamed
chat completions under one or more loads, printing per load the requests sent, completed and
failed, throughput (requests/s, output tokens/s, and x the first load), time to first token
(TTFT) and time per output token after the first (TPOT) at p50/p90/p99.

Loads (scripts/serving_stats.py): `concurrency:C` (C workers back to back), `rate:R` (Poisson
arrivals at R requests/s, `rate:inf` all at once), `interval:S` (one request every S s). Each
load sends the same --num_requests requests: prompts of seeded words and output lengths drawn
from --input_len/--output_len with their --*_spread (seeded by --seed), so every load and
every server gets the same requests. At temperature 0 each answer is compared with the
first load's answer to the same request ("same" column): run `concurrency:1` first and that
is each request's solo answer. Output tokens are the server's usage
(stream_options.include_usage), else the text chunks received. "bound" is the most tokens/s
the load's arrivals allow: had every request taken only its time in the first load (alone,
with `concurrency:1` first) from when it was sent (serving_stats.solo_bound); "x bound" is
how much of it the server reached. Requests spread over time cap throughput whatever the
server does: 8 requests one every 0.5 s end no sooner than 3.5 s plus the last one's own time.

    python scripts/bench_serving.py --url http://127.0.0.1:8000 --api_key KEY \\
        --loads concurrency:1 rate:inf interval:0.5 --num_requests 8 --output_len 32
    # or start 2 `drift server`s over the block halves and a `drift api` with its defaults:
    PYTHONPATH=. python scripts/bench_serving.py --swarm smollm2 \\
        --loads concurrency:1 rate:inf interval:0.5 --num_requests 8 --output_len 32

--plot FILE.png draws TTFT and TPOT against the achieved requests/s (needs matplotlib, which
DRIFT does not depend on: without it the plot is skipped with a message). --json FILE keeps
every summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_stats import (  # noqa: E402
    Load,
    Outcome,
    arrival_offsets,
    lengths,
    parse_load,
    prompt_text,
    solo_bound,
    summarize,
)


def request_bodies(args: argparse.Namespace, model: str) -> list[dict]:
    """The run's requests, the same for every load (seeded)."""
    n = args.num_requests
    inputs = lengths(n, args.input_len, args.input_spread, args.seed)
    outputs = lengths(n, args.output_len, args.output_spread, args.seed + 1)
    extra = json.loads(args.extra_body) if args.extra_body else {}
    bodies = []
    for i in range(n):
        body = {"model": model, "max_tokens": outputs[i], "temperature": args.temperature,
                "messages": [{"role": "user", "content": prompt_text(i, inputs[i], args.seed)}],
                "stream": True, "stream_options": {"include_usage": True}, **extra}  # fmt: skip
        if args.temperature > 0:
            body.setdefault("seed", args.seed + i)
        bodies.append(body)
    return bodies


async def send(http: aiohttp.ClientSession, url: str, body: dict, index: int,
               t0: float) -> Outcome:  # fmt: skip
    """One streamed chat completion; never raises (failures become `error`)."""
    out = Outcome(index=index, sent=time.perf_counter() - t0)
    usage, chunks, finished = None, 0, False
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                out.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return out
            async for raw in r.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                event = json.loads(data)
                if "error" in event:
                    out.error = f"in-stream error: {str(event['error'])[:200]}"
                    return out
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text:
                        now = time.perf_counter() - t0
                        out.first = now if out.first is None else out.first
                        out.chunk_times.append(now)
                        out.text += text
                        chunks += 1
                    finished = finished or choice.get("finish_reason") is not None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
        return out
    out.done = time.perf_counter() - t0
    if not finished:
        out.error = "the stream ended before a finish_reason or [DONE]"
    out.tokens = usage["completion_tokens"] if usage else chunks
    return out


async def run_load(http: aiohttp.ClientSession, url: str, load: Load, bodies: list[dict],
                   seed: int) -> tuple[list[Outcome], float]:  # fmt: skip
    """All `bodies` under `load`: (outcomes in request order, wall seconds from the first
    send to the last answer)."""
    t0 = time.perf_counter()
    offsets = arrival_offsets(load, len(bodies), seed)
    if offsets is None:  # fixed concurrency: workers take the next request when free
        pending = iter(range(len(bodies)))
        outcomes: list[Outcome] = []

        async def worker() -> None:
            for i in pending:
                outcomes.append(await send(http, url, bodies[i], i, t0))

        await asyncio.gather(*(worker() for _ in range(int(load.value))))
        outcomes.sort(key=lambda o: o.index)
    else:

        async def at(i: int, offset: float) -> Outcome:
            await asyncio.sleep(max(0.0, offset - (time.perf_counter() - t0)))
            return await send(http, url, bodies[i], i, t0)

        outcomes = list(await asyncio.gather(*(at(i, o) for i, o in enumerate(offsets))))
    return outcomes, time.perf_counter() - t0


async def first_model(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/v1/models") as r:
        if r.status != 200:
            raise SystemExit(f"GET {url}/v1/models: HTTP {r.status}: {(await r.text())[:200]}")
        return (await r.json())["data"][0]["id"]


async def warm_up(http: aiohttp.ClientSession, url: str, model: str, wait_s: float) -> None:
    """One short request, retried while the server answers 503 (a swarm still gossiping)."""
    body = {"model": model, "max_tokens": 2, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    deadline = time.monotonic() + wait_s
    while True:
        outcome = await send(http, url, body, -1, time.perf_counter())
        if outcome.error is None:
            return
        if not outcome.error.startswith("HTTP 503") or time.monotonic() > deadline:
            raise SystemExit(f"warm-up request failed: {outcome.error}")
        await asyncio.sleep(1.0)


def same_count(outcomes: list[Outcome], baseline: list[Outcome]) -> str:
    """'k/n': of the n requests completed in both runs, k answered the same text."""
    pairs = [(o, b) for o, b in zip(outcomes, baseline, strict=True)
             if o.error is None and b.error is None]  # fmt: skip
    return f"{sum(o.text == b.text for o, b in pairs)}/{len(pairs)}"


HEADER = (f"{'load':>16} {'sent':>4} {'ok':>4} {'err':>4} {'wall s':>7} {'req/s':>6} "
          f"{'tok/s':>7} {'x first':>7} {'TTFT p50/p90/p99 ms':>20} "
          f"{'TPOT p50/p90/p99 ms':>20} {'same':>5} {'bound':>6} {'x bound':>7}")  # fmt: skip


def row(label: str, s: dict, base: dict | None, same: str) -> str:
    def trio(name: str) -> str:
        return "/".join("-" if math.isnan(s[f"{name}_p{q}"]) else f"{s[f'{name}_p{q}']:.0f}"
                        for q in (50, 90, 99))  # fmt: skip

    ratio = s["output_tokens_per_s"] / base["output_tokens_per_s"] if base else 1.0
    bound = s["bound_tokens_per_s"]
    of_bound = s["output_tokens_per_s"] / bound if bound > 0 else math.nan
    return (f"{label:>16} {s['requests']:>4} {s['completed']:>4} {s['errors']:>4} "
            f"{s['wall_s']:>7.2f} {s['requests_per_s']:>6.2f} {s['output_tokens_per_s']:>7.1f} "
            f"{ratio:>6.2f}x {trio('ttft_ms'):>20} {trio('tpot_ms'):>20} {same:>5} "
            f"{_num(s['bound_tokens_per_s'], '.1f'):>6} "
            f"{_num(of_bound, '.2f'):>6}x")  # fmt: skip


def _num(value: float, fmt: str) -> str:
    return "-" if math.isnan(value) else format(value, fmt)


async def bench(url: str, api_key: str, args: argparse.Namespace) -> list[dict]:
    """Every load in turn; prints the table and returns each load's summary (with its
    outcomes' texts and token counts under 'answers')."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    summaries: list[dict] = []
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        model = args.model or await first_model(http, url)
        if args.warmup:
            await warm_up(http, url, model, args.ready_timeout)
        bodies = request_bodies(args, model)
        print(f"{url} model {model!r}: {len(bodies)} requests per load, temperature "
              f"{args.temperature:g}", flush=True)  # fmt: skip
        print(HEADER, flush=True)
        baseline: list[Outcome] | None = None
        for load in args.loads:
            outcomes, wall = await run_load(http, url, load, bodies, args.seed)
            s = summarize(outcomes, wall)
            s["bound_tokens_per_s"] = solo_bound(outcomes, baseline or outcomes)
            same = same_count(outcomes, baseline) if baseline and args.temperature == 0 else "-"
            print(row(load.label, s, summaries[0] if summaries else None, same), flush=True)
            for message in s["error_messages"]:
                print(f"{'':>16} error: {message}", flush=True)
            s.update(load=load.label, same_as_first=same,
                     answers=[{"text": o.text, "tokens": o.tokens, "error": o.error}
                              for o in outcomes])  # fmt: skip
            summaries.append(s)
            baseline = baseline or outcomes
    return summaries


def plot(summaries: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path} "
              "(pip install matplotlib to get it)", file=sys.stderr)  # fmt: skip
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = [s["requests_per_s"] for s in summaries]
    for ax, name, title in ((axes[0], "ttft_ms", "time to first token"),
                            (axes[1], "tpot_ms", "time per output token")):  # fmt: skip
        for q in (50, 99):
            ax.plot(xs, [s[f"{name}_p{q}"] for s in summaries], "o-", label=f"p{q}")
        for x, s in zip(xs, summaries, strict=True):
            ax.annotate(s["load"], (x, s[f"{name}_p50"]), fontsize=7)
        ax.set(title=title, xlabel="achieved requests/s", ylabel="ms")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}", file=sys.stderr)


def _load(text: str) -> Load:
    try:
        return parse_load(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running server (http://host:port)")
    where.add_argument("--swarm", metavar="MODEL",
                       help="start 2 `drift server`s over the block halves of MODEL and a "
                            "`drift api` with its defaults on 127.0.0.1, bench it, stop them")  # fmt: skip
    p.add_argument("--api_args", default="",
                   help="with --swarm: more `drift api` flags, e.g. '--prefix_sessions 0'")  # fmt: skip
    p.add_argument("--api_key", default="", help="Bearer key (none: no Authorization header)")
    p.add_argument("--model", default="", help="model id to request (default: the first listed)")
    p.add_argument("--loads", type=_load, nargs="+", default=[parse_load("concurrency:1")],
                   help="KIND:VALUE, one run each: concurrency:C, rate:R (Poisson; inf = all "
                        "at once), interval:S (default: concurrency:1)")  # fmt: skip
    p.add_argument("--num_requests", type=int, default=8, help="requests per load (default 8)")
    p.add_argument("--input_len", type=int, default=16, help="mean prompt length in words")
    p.add_argument("--input_spread", type=float, default=0.0,
                   help="prompt lengths uniform within +- this fraction (default 0)")  # fmt: skip
    p.add_argument("--output_len", type=int, default=32, help="mean max_tokens (default 32)")
    p.add_argument("--output_spread", type=float, default=0.0,
                   help="max_tokens uniform within +- this fraction (default 0)")  # fmt: skip
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="seeds prompts, lengths and arrivals")
    p.add_argument("--extra_body", default="",
                   help="JSON merged into every request, e.g. '{\"ignore_eos\": true}' (vLLM)")  # fmt: skip
    p.add_argument("--warmup", type=int, default=1, help="send one short request first (1/0)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request")
    p.add_argument("--ready_timeout", type=float, default=180,
                   help="seconds the warm-up retries while the server answers 503")  # fmt: skip
    p.add_argument("--plot", metavar="FILE.png", help="latency against load (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write every load's summary as JSON")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.num_requests < 1 or args.input_len < 1 or args.output_len < 1:
        raise SystemExit("--num_requests, --input_len and --output_len must be >= 1")
    if not (0 <= args.input_spread <= 1 and 0 <= args.output_spread <= 1):
        raise SystemExit("--input_spread and --output_spread must be within [0, 1]")
    if args.swarm:
        from serving_swarm import api_over_swarm

        with api_over_swarm(args.swarm, args.api_args.split()) as (url, key):
            summaries = asyncio.run(bench(url, key, args))
    else:
        summaries = asyncio.run(bench(args.url.rstrip("/"), args.api_key, args))
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1))
    if args.plot:
        plot(summaries, args.plot)


if __name__ == "__main__":
    main()
