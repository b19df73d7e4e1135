"""Per-step latency of a one-hop inference session vs the same span run in-process.

A SmolLM2-sized span (hidden 576, 15 blocks) with random weights from SmolLM2's config
(or the real checkpoint with --model smollm2): starts a real server on 127.0.0.1, runs a
prompt then N decode steps over its WebSocket, each followed by the same step on a local
SpanSession (interleaved), and prints medians: round trip, the server's step and compute
time inside it, the local step, their ratio and where the overhead goes.

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
from typing import Any

import aiohttp
import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.server.backend import SpanBackend  # noqa: E402
from drift.server.sessions import SessionManager  # noqa: E402
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


class StepTimers:
    """Seconds of each step inside the server: the whole step and its compute-thread part."""

    def __init__(self) -> None:
        self.step: list[float] = []  # SessionManager.step: checks + executor round trip
        # the step's work on the compute thread: SpanBackend.run_steps (plain steps, batched)
        # or SessionManager._step (the rest)
        self.compute: list[float] = []
        orig_step, orig_compute = SessionManager.step, SessionManager._step
        orig_steps = SpanBackend.run_steps

        async def step(manager: Any, sid: str, req: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await orig_step(manager, sid, req)
            finally:
                self.step.append(time.perf_counter() - t0)

        def compute(manager: Any, *args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig_compute(manager, *args)
            finally:
                self.compute.append(time.perf_counter() - t0)

        def run_steps(backend: Any, steps: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig_steps(backend, steps)
            finally:
                self.compute.append(time.perf_counter() - t0)

        SessionManager.step = step  # type: ignore[method-assign]
        SessionManager._step = compute  # type: ignore[method-assign]
        SpanBackend.run_steps = run_steps  # type: ignore[method-assign]


async def bench(model: str, start: int, end: int, prompt: int, steps: int) -> None:
    timers = StepTimers()
    running = await start_block_server(Path(model), start, end, inference_max_length=4096)
    try:
        backend = running.server.backend
        hidden = backend.hidden_size
        remote: list[float] = []
        local: list[float] = []
        cache = backend.span.new_session(batch_size=1, max_length=prompt + steps)
        async with aiohttp.ClientSession() as http:
            sess = await RawSession.open(http, running.url, backend.fingerprint, start, end,
                                         max_length=prompt + steps)  # fmt: skip
            await sess.step(torch.randn(1, prompt, hidden), 0)
            with torch.no_grad():
                cache.step(torch.randn(1, prompt, hidden))
            del timers.step[:], timers.compute[:]
            for i in range(steps):  # interleaved: remote then local, same conditions
                t0 = time.perf_counter()
                await sess.step(torch.randn(1, 1, hidden), prompt + i)
                remote.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with torch.no_grad():
                    cache.step(torch.randn(1, 1, hidden))
                local.append(time.perf_counter() - t0)
            await sess.close()
    finally:
        await running.stop()
    med = {
        "one-hop session round trip": statistics.median(remote) * 1e3,
        "  server step (checks + executor)": statistics.median(timers.step) * 1e3,
        "  server compute (compute thread)": statistics.median(timers.compute) * 1e3,
        "in-process SpanSession.step": statistics.median(local) * 1e3,
    }
    r, lo = med["one-hop session round trip"], med["in-process SpanSession.step"]
    print(f"span [{start}, {end}) hidden {hidden}: {steps} steps after a {prompt}-token prompt, "
          f"torch threads {torch.get_num_threads()}, medians")  # fmt: skip
    for label, value in med.items():
        print(f"{label:<36}: {value:8.2f} ms/step")
    wire = r - med["  server step (checks + executor)"]
    handoff = med["  server step (checks + executor)"] - med["  server compute (compute thread)"]
    print(f"ratio                               : {r / lo:8.2f}x  (overhead {r - lo:.2f} ms/step: "
          f"wire + frames {wire:.2f}, executor handoff {handoff:.2f})")  # fmt: skip


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
