"""Per-step latency of a one-hop inference session vs the same span run in-process.

A SmolLM2-sized span (hidden 576, 15 blocks) with random weights from SmolLM2's config
(or the real checkpoint with --model smollm2): starts a real server on 127.0.0.1, runs a
prompt then N decode steps over its WebSocket, then the same steps on a local SpanSession,
and prints both medians and their ratio.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_server.py --steps 50
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
from tests.server.harness import start_block_server  # noqa: E402
from tests.server.wsclient import RawSession  # noqa: E402

SMOLLM2_CONFIG = dict(
    hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
    num_hidden_layers=30, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=True,
)  # fmt: skip


def random_smollm2(directory: Path) -> Path:
    config = AutoConfig.for_model("llama", **SMOLLM2_CONFIG)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


async def bench(model: str, start: int, end: int, prompt: int, steps: int) -> None:
    running = await start_block_server(Path(model), start, end, inference_max_length=4096)
    try:
        backend = running.server.backend
        hidden = backend.hidden_size
        remote: list[float] = []
        async with aiohttp.ClientSession() as http:
            sess = await RawSession.open(http, running.url, backend.fingerprint, start, end,
                                         max_length=prompt + steps)  # fmt: skip
            await sess.step(torch.randn(1, prompt, hidden), 0)
            for i in range(steps):
                t0 = time.perf_counter()
                await sess.step(torch.randn(1, 1, hidden), prompt + i)
                remote.append(time.perf_counter() - t0)
            await sess.close()
        local: list[float] = []
        cache = backend.span.new_session(batch_size=1, max_length=prompt + steps)
        with torch.no_grad():
            cache.step(torch.randn(1, prompt, hidden))
            for _ in range(steps):
                t0 = time.perf_counter()
                cache.step(torch.randn(1, 1, hidden))
                local.append(time.perf_counter() - t0)
    finally:
        await running.stop()
    r, lo = statistics.median(remote) * 1e3, statistics.median(local) * 1e3
    print(f"span [{start}, {end}) hidden {hidden}: {steps} steps after a {prompt}-token prompt")
    print(f"one-hop session : {r:8.2f} ms/step (median)")
    print(f"in-process      : {lo:8.2f} ms/step (median)")
    print(f"ratio           : {r / lo:8.2f}x  (overhead {r - lo:.2f} ms/step)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint dir (default: random SmolLM2 config)")
    p.add_argument("--blocks", default="0:15", help="span START:END (default 0:15)")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args()
    start, end = (int(x) for x in args.blocks.split(":"))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = str(random_smollm2(Path(tmp) / "smollm2-random"))
        elif not Path(model).is_dir():
            from drift.models.checkpoint import open_checkpoint

            model = str(open_checkpoint(model).path)
        asyncio.run(bench(model, start, end, args.prompt, args.steps))


if __name__ == "__main__":
    main()
