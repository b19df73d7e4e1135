"""Decode tokens/s of the swarm against local transformers generate() on the same model.

SmolLM2 (open_checkpoint("smollm2")) served by 2 and then 3 in-process block servers on
loopback; greedy decoding of `--new` tokens; prints tokens/s for local, each swarm, and
the ratio swarm/local (Petals 2.2 gets 0.41x).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoModelForCausalLM  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from tests.client.conftest import start_swarm, stop_swarm  # noqa: E402


def decode_rate(model, ids: torch.Tensor, new: int) -> float:
    model.generate(ids, max_new_tokens=2, do_sample=False)  # warm up
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return new / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = open_checkpoint(args.model).path
    ids = torch.tensor([[1, 504, 2365, 3290, 253]])
    local = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    local_rate = decode_rate(local, ids, args.new)
    print(f"local transformers: {local_rate:.2f} tokens/s")
    n = local.config.num_hidden_layers
    for parts in (2, 3):
        bounds = [n * i // parts for i in range(parts + 1)]
        swarm = await start_swarm(directory, list(zip(bounds, bounds[1:], strict=False)))
        try:
            model = await asyncio.to_thread(
                AutoDistributedModelForCausalLM.from_pretrained, directory,
                initial_peers=swarm.token,
            )  # fmt: skip
            rate = await asyncio.to_thread(decode_rate, model, ids, args.new)
            await asyncio.to_thread(model.close)
        finally:
            await stop_swarm(swarm)
        print(f"swarm, {parts} servers: {rate:.2f} tokens/s  ratio {rate / local_rate:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
