"""LoRA training through the swarm against local peft: bytes per step and step time.

SmolLM2 served by 2 `drift server` processes on 127.0.0.1 (scripts/bench_client.py's
ServerProcs, OMP_NUM_THREADS=1 each); the client trains LoRA (`tuning_mode="lora"`,
`--r`, `--targets`) on a batch of `--batch` x `--tokens` random tokens with Adam. The same
steps run locally with peft on the same model (torch.set_num_threads(1)), interleaved
`--reps` times. Prints median step times, the ratio swarm/local, and the frame bytes the
client sent and received per step (exact: every frame goes through drift.wire.codec
encode/decode), with the LoRA weights' and gradients' share.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_lora.py --reps 5
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

from drift.client import AutoDistributedModelForCausalLM  # noqa: E402
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.wire import codec  # noqa: E402
from drift.wire.lora import is_lora  # noqa: E402


class FrameBytes:
    """Bytes of every frame the client encodes (up) and decodes (down), while `on`; and the
    LoRA tensors' share of each."""

    def __init__(self) -> None:
        self.up = self.down = self.lora_up = self.lora_down = 0
        self.on = False
        self._encode, self._decode = codec.encode, codec.decode

    def encode(self, message: Any, wire_dtype: str | None = None) -> bytes:
        data = self._encode(message, wire_dtype)
        if self.on:
            self.up += len(data)
            self.lora_up += _lora_bytes(message.to_wire()[1])
        return data

    def decode(self, cls: Any, body: bytes, *args: Any, **expect: Any) -> Any:
        reply = self._decode(cls, body, *args, **expect)
        if self.on:
            self.down += len(body)
            self.lora_down += _lora_bytes(getattr(reply, "grad_extras", {}))
        return reply


def _lora_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for n, t in tensors.items() if is_lora(n))


BYTES = FrameBytes()
codec.encode = BYTES.encode  # type: ignore[assignment]
codec.decode = BYTES.decode  # type: ignore[assignment]


def batch(vocab: int, size: int, tokens: int) -> torch.Tensor:
    return torch.randint(0, vocab, (size, tokens), generator=torch.Generator().manual_seed(0))


def step(model: Any, opt: Any, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    opt.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def local_peft(directory: Path, r: int, targets: list[str]) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--r", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,v_proj")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    targets = args.targets.split(",")
    directory = open_checkpoint("smollm2", dtype=torch.float32).path
    local = local_peft(directory, args.r, targets)
    local_opt = torch.optim.Adam([p for p in local.parameters() if p.requires_grad], lr=1e-4)
    ids = batch(local.config.vocab_size, args.batch, args.tokens)
    threads = torch.get_num_threads()
    times: dict[str, list[float]] = {"local peft": [], "swarm": []}
    with tempfile.TemporaryDirectory() as tmp:
        procs = ServerProcs(str(directory), [(0, 15), (15, 30)], Path(tmp))
        try:
            lora = {"r": args.r, "lora_alpha": 2 * args.r, "target_modules": targets}
            model = AutoDistributedModelForCausalLM.from_pretrained(
                directory, initial_peers=procs.token, tuning_mode="lora", lora_config=lora
            )
            wait_covered(model, 30)
            opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            step(model, opt, ids)  # warm-up (connections, first allocations)
            torch.set_num_threads(1)
            step(local, local_opt, ids)
            torch.set_num_threads(threads)
            for _ in range(args.reps):
                BYTES.up = BYTES.down = BYTES.lora_up = BYTES.lora_down = 0
                BYTES.on = True
                times["swarm"].append(step(model, opt, ids))
                BYTES.on = False
                torch.set_num_threads(1)
                times["local peft"].append(step(local, local_opt, ids))
                torch.set_num_threads(threads)
            model.close()
        finally:
            procs.stop()
    medians = {k: statistics.median(v) for k, v in times.items()}
    mib = 1 << 20
    n_params = sum(p.numel() for p in local.parameters() if p.requires_grad)
    print(f"SmolLM2, LoRA r={args.r} on {','.join(targets)} ({n_params:,} weights), batch "
          f"{args.batch} x {args.tokens} tokens, 2 servers, median of {args.reps}")  # fmt: skip
    for name, value in medians.items():
        print(f"  {name:<11} {value:.3f} s/step")
    print(f"  ratio swarm/local: {medians['swarm'] / medians['local peft']:.2f}x")
    print(f"  per step: up {BYTES.up / mib:.2f} MiB (LoRA weights {BYTES.lora_up / mib:.2f}), "
          f"down {BYTES.down / mib:.2f} MiB (LoRA gradients {BYTES.lora_down / mib:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
