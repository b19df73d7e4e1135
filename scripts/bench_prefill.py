"""Prefill tokens/s of a long prompt through 2 servers, chunked and pipelined vs one piece,
against local transformers on the same model.

SmolLM2 (real weights) served by 2 `drift server` processes on 127.0.0.1 (one compute thread
each, OMP_NUM_THREADS=1); the client steps a `--tokens` prompt's embeddings through a
session once with `prefill_chunk_tokens=--chunk` (pipelined along the two servers) and once
in one piece (0), interleaved `--reps` times with a local forward of the same prompt
(torch.set_num_threads(1)). Prints medians and the ratios to local.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_prefill.py --tokens 2048 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import ServerProcs, wait_covered  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM, ClientConfig  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402


def swarm_prefill(model: Any, embeds: torch.Tensor) -> float:
    with torch.no_grad(), model.open_session(max_length=embeds.shape[1]) as session:
        start = time.perf_counter()
        session.step(embeds)
        return time.perf_counter() - start


def local_prefill(local: Any, ids: torch.Tensor) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        local.model(ids, use_cache=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=512, help="prefill_chunk_tokens")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ckpt = open_checkpoint(args.model)
    local = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    n = int(ckpt.config.num_hidden_layers)
    ids = torch.randint(0, int(ckpt.config.vocab_size), (1, args.tokens),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    with torch.no_grad():
        embeds = local.model.embed_tokens(ids)
    times: dict[str, list[float]] = {"local": [], "chunked": [], "one piece": []}
    models: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = ServerProcs(str(ckpt.path), [(0, n // 2), (n // 2, n)], Path(tmp),
                            ("--inference_max_length", str(max(2048, args.tokens))))  # fmt: skip
        try:
            for label, chunk in (("chunked", args.chunk), ("one piece", 0)):
                models[label] = AutoDistributedModelForCausalLM.from_pretrained(
                    ckpt.path, initial_peers=procs.token,
                    client_config=ClientConfig(prefill_chunk_tokens=chunk),
                )  # fmt: skip
                wait_covered(models[label], n)
                swarm_prefill(models[label], embeds[:, :64])  # warm up
            for rep in range(args.reps):
                times["local"].append(local_prefill(local, ids))
                for label, model in models.items():
                    times[label].append(swarm_prefill(model, embeds))
                print(f"rep {rep + 1}: " + ", ".join(
                    f"{k} {args.tokens / v[-1]:.0f} tokens/s" for k, v in times.items()), flush=True)  # fmt: skip
        finally:
            for model in models.values():
                model.close()
            procs.stop()
    rate = {k: args.tokens / statistics.median(v) for k, v in times.items()}
    print(f"\n{args.model}, {args.tokens}-token prefill, 2 servers, medians of {args.reps} runs")
    print("| setup | prefill tokens/s | vs local |")
    print("| --- | --- | --- |")
    print(f"| local transformers | {rate['local']:.0f} | 1.00x |")
    print(f"| 2 servers, {args.chunk}-token chunks pipelined | {rate['chunked']:.0f} | "
          f"{rate['chunked'] / rate['local']:.2f}x |")  # fmt: skip
    print(f"| 2 servers, one piece | {rate['one piece']:.0f} | "
          f"{rate['one piece'] / rate['local']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
