"""Time to first token of a second chat turn through `drift api`: continuing the first
turn's held session (prefix reuse) against a cold request for the same conversation.

SmolLM2 over a loopback swarm of two in-process block servers (halves of the blocks, as
scripts/bench_api.py --swarm). Two `drift api` apps on the same model: one with a
SessionPool (`--prefix_sessions`), one without. Each runs turn 1 (a long system prompt and a
question), then turn 2 (the conversation so far plus a new question, streamed); the time to
its first streamed token is taken, `--reps` times with new questions, interleaved.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_prefix.py --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEM = " ".join(["You are a careful assistant who answers about the history of European "
                   "cities, their rivers, bridges, markets and old quarters."] * 12)  # fmt: skip


async def chat(http: aiohttp.ClientSession, url: str, messages: list[dict], max_tokens: int,
               ) -> tuple[float, str]:  # fmt: skip
    """(seconds to the first streamed token, the whole answer)."""
    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    start, first, text = time.perf_counter(), None, ""
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise SystemExit(f"HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = orjson.loads(line[6:])["choices"][0].get("delta", {}).get("content")
            if delta:
                first = first or time.perf_counter() - start
                text += delta
    return first or time.perf_counter() - start, text


async def serve(engine: Any) -> tuple[Any, str]:
    from aiohttp import web

    from drift.api.app import ApiConfig, build_api_app
    from drift.api.service import ServiceConfig

    app = build_api_app(engine, ApiConfig(api_keys=("bench",), service=ServiceConfig()))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def main_async(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from drift.api.prefix import SessionPool
    from drift.api.swarm import swarm_engine
    from drift.client import AutoDistributedModelForCausalLM
    from drift.models.checkpoint import open_checkpoint
    from tests.client.swarms import start_swarm, stop_swarm

    ckpt = open_checkpoint(args.model)
    n = ckpt.config.num_hidden_layers
    swarm = await start_swarm(ckpt.path, [(0, n // 2), (n // 2, n)])
    model, runners = None, []
    try:
        model = await asyncio.to_thread(AutoDistributedModelForCausalLM.from_pretrained,
                                        ckpt.path, initial_peers=swarm.token)  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
        pool = SessionPool(model)
        urls = {}
        for label, p in (("prefix reuse", pool), ("cold", None)):
            runner, urls[label] = await serve(swarm_engine(model, tokenizer, model_id="bench",
                                                           pool=p))  # fmt: skip
            runners.append(runner)
        ttft: dict[str, list[float]] = {label: [] for label in urls}
        same = True  # the second turn's answer is the same with and without reuse
        headers = {"Authorization": "Bearer bench"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for rep in range(args.reps):
                first = [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Tell me about bridge number {rep}."}]  # fmt: skip
                answers = set()
                for label, url in urls.items():
                    _, answer = await chat(http, url, first, args.max_tokens)
                    second = [*first, {"role": "assistant", "content": answer},
                              {"role": "user", "content": "And the markets there?"}]  # fmt: skip
                    seconds, text = await chat(http, url, second, args.max_tokens)
                    ttft[label].append(seconds)
                    answers.add(text)
                same = same and len(answers) == 1
                print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1] * 1e3:.0f} ms"
                                                    for k, v in ttft.items()), flush=True)  # fmt: skip
        text = tokenizer.apply_chat_template(second, add_generation_prompt=True, tokenize=False)
        prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        print(f"\n{args.model}, 2 in-process servers, second turn of {prompt} prompt tokens, "
              f"medians of {args.reps}; prefix reuse continued {pool.hits} sessions, "
              f"{pool.reused_tokens} prompt tokens not sent again; answers equal: {same}")  # fmt: skip
        print("| second turn | time to first token |")
        print("| --- | --- |")
        for label, values in ttft.items():
            print(f"| {label} | {statistics.median(values) * 1e3:.0f} ms |")
    finally:
        for runner in runners:
            await runner.cleanup()
        if model is not None:
            await asyncio.to_thread(model.close)
        await stop_swarm(swarm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max_tokens", type=int, default=16)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
