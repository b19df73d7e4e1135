"""Time to first token of `drift api`'s engine over emulated slow links, against the SDK.

Three `drift server` processes for SmolLM2 (float32, TLS) on 127.0.0.1, each behind the
delaying, rate-limiting proxy of scripts/bench_network.py (`--rtts` milliseconds of round
trip, `--rate_mbit` each way: every connection to a server crosses one emulated link). The
API's engine is built as `drift api` builds it (drift.api.swarm.swarm_engine over a
SessionPool of `--held` sessions) in this process, without HTTP. Each request is a fresh
prompt of `--prompt` random tokens (no held session continues it) generating 2 tokens;
its time to first token is timed from the call to the first token's callback. The baseline,
in the same run and interleaved: the SDK's greedy generate() of one token for another fresh
prompt of that length on the same swarm. Requests come apart (a pause of 0.1 s + 3 RTT
after each, so no request waits for the close of the one before: drift.client.spares).
Medians over `--reps`.

With `--held` 8 (the API's default) and enough requests, the API's held conversations fill
its share of each server's KV budget: every new conversation then pays a refusal and the
eviction of a held one (printed apart, as "evicting").

    .venv/bin/python scripts/bench_api_network.py --rtts 0,50 --reps 12 --held 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_network import Servers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from drift.api.engine import GenerationParams  # noqa: E402
from drift.api.prefix import SessionPool  # noqa: E402
from drift.api.swarm import swarm_engine  # noqa: E402
from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402

PARAMS = GenerationParams(max_new_tokens=2, temperature=0.0, top_p=1.0, presence_penalty=0.0,
                          frequency_penalty=0.0, top_logprobs=None)  # fmt: skip


def api_ttft(engine: Any, prompt: list[int]) -> float:
    first: list[float] = []
    start = time.perf_counter()
    engine.generate(prompt, PARAMS, torch.Generator().manual_seed(0),
                    lambda event: first.append(time.perf_counter()), threading.Event())  # fmt: skip
    return first[0] - start


def sdk_ttft(model: Any, prompt: list[int]) -> float:
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=1, do_sample=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rtts", default="0,50", help="round trips to emulate, in ms")
    parser.add_argument("--rate_mbit", type=float, default=1000.0)
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--prompt", type=int, default=20, help="prompt tokens per request")
    parser.add_argument("--held", type=int, default=8,
                        help="the API's held sessions (drift api --prefix_sessions)")  # fmt: skip
    args = parser.parse_args()
    directory = open_checkpoint(args.model).path
    tokenizer = AutoTokenizer.from_pretrained(directory)
    rng = random.Random(0)

    def fresh() -> list[int]:
        return [rng.randrange(100, tokenizer.vocab_size - 100) for _ in range(args.prompt)]

    with tempfile.TemporaryDirectory() as tmp:
        servers = Servers(str(directory), [(0, 10), (10, 20), (20, 30)], Path(tmp))
        model = None
        try:
            servers.wait_all_listed()
            model = AutoDistributedModelForCausalLM.from_pretrained(
                directory, initial_peers=servers.token
            )
            pool = SessionPool(model, max_sessions=args.held)
            engine = swarm_engine(model, tokenizer, model_id=args.model, pool=pool)
            for _ in range(3):  # warm up: connections, push links, spares
                api_ttft(engine, fresh())
                sdk_ttft(model, fresh())
            print(f"{args.model}, 3 servers over TLS, {args.prompt}-token fresh prompts, "
                  f"{args.held} held sessions at most, medians of {args.reps}")  # fmt: skip
            for rtt in [float(r) for r in args.rtts.split(",")]:
                servers.set_link(rtt, args.rate_mbit)
                api, sdk, evicting = [], [], []
                pause = 0.1 + 3 * rtt / 1e3  # requests apart: the last one's close is through
                for _ in range(args.reps):
                    released = pool.released
                    took = api_ttft(engine, fresh())
                    (evicting if pool.released > released else api).append(took)
                    time.sleep(pause)
                    sdk.append(sdk_ttft(model, fresh()))
                    time.sleep(pause)
                line = f"RTT {rtt:g} ms: SDK {statistics.median(sdk) * 1e3:.1f} ms"
                if api:
                    line += (f", drift api {statistics.median(api) * 1e3:.1f} ms "
                             f"({statistics.median(api) / statistics.median(sdk):.2f}x SDK)")  # fmt: skip
                if evicting:
                    line += (f", drift api evicting a held session "
                             f"{statistics.median(evicting) * 1e3:.1f} ms ({len(evicting)} of "
                             f"{args.reps})")  # fmt: skip
                print(line, flush=True)
        finally:
            if model is not None:
                model.close()
            servers.stop()


if __name__ == "__main__":
    main()
