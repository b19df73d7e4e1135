"""Prompt-tune a distributed model on a tiny task and print the falling loss.

Starts real block servers on loopback (in-process, two spans), builds a small task in the
script (continue each prompt with a fixed answer token sequence), trains only the client's
prompts (`--mode ptune|deep_ptune`) and prints the loss per step. `--tiny` uses a tiny
random llama instead of the SmolLM2 demo model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from tests.client.swarms import start_swarm, stop_swarm  # noqa: E402
from tests.tiny_models import save_tiny  # noqa: E402


def model_dir(tiny: bool, tmp: Path) -> Path:
    if tiny:
        return save_tiny("llama", tmp / "llama")
    from drift.models.checkpoint import open_checkpoint

    return open_checkpoint("smollm2").path


def train(model, steps: int, lr: float) -> list[float]:
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = torch.randint(0, vocab, (8, 6), generator=gen)
    answer = torch.randint(0, vocab, (1, 3), generator=gen).expand(8, -1)
    ids = torch.cat([prompts, answer], dim=1)
    labels = ids.clone()
    labels[:, :6] = -100
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(ids, labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    return losses


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--mode", default="deep_ptune", choices=["ptune", "deep_ptune"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = model_dir(args.tiny, Path(tmp))
        n = 4 if args.tiny else 30
        swarm = await start_swarm(directory, [(0, n // 2), (n // 2, n)])
        try:
            model = await asyncio.to_thread(
                AutoDistributedModelForCausalLM.from_pretrained, directory,
                initial_peers=swarm.token, tuning_mode=args.mode, pre_seq_len=4,
            )  # fmt: skip
            losses = await asyncio.to_thread(train, model, args.steps, args.lr)
            await asyncio.to_thread(model.close)
        finally:
            await stop_swarm(swarm)
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", "(fell)" if losses[-1] < losses[0] else "")


if __name__ == "__main__":
    asyncio.run(main())
