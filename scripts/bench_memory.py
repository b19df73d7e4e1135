"""Resident memory of real `drift server` processes by quantization and span size.

Starts one `drift server MODEL --block_indices A:B --quant_type Q` process at a time (CPU,
float32 compute, throughput pinned so no benchmark runs), waits until it serves, and takes:
the RSS the server logged just before and just after loading its blocks (the same process),
and its VmRSS read from /proc/<pid>/status by this script once it serves. Weight memory is
after - before. Prints each run, its ratio to the float32 run of the same span, and the
estimate `drift up` sizes spans with (drift.models.footprint), then checks the targets:
int8 <= 0.35x and nf4 <= 0.2x float32 over all blocks; 10 of 30 blocks ~ a third of 30.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_memory.py            # SmolLM2, ~2 min
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_memory.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from drift.models.checkpoint import open_checkpoint  # noqa: E402
from drift.models.footprint import block_weight_bytes  # noqa: E402
from tests.procs import DriftProc  # noqa: E402

LOADED = re.compile(r"take ([\d.]+) MiB resident \(RSS ([\d.]+) -> ([\d.]+) MiB\)")
MIB = 1 << 20


@dataclass
class Run:
    quant: str
    start_block: int
    end_block: int
    rss_before_mib: float  # logged by the server right before loading its blocks
    rss_after_mib: float  # logged right after
    weights_mib: float  # after - before
    vmrss_serving_mib: float  # /proc/<pid>/status of the serving process, read by this script
    estimate_mib: float  # drift.models.footprint for the span

    @property
    def blocks(self) -> int:
        return self.end_block - self.start_block


def vmrss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def measure(model: str, cache: Path, quant: str, start: int, end: int, config) -> Run:
    args = ["server", model, "--block_indices", f"{start}:{end}", "--quant_type", quant,
            "--device", "cpu", "--torch_dtype", "float32", "--throughput", "1",
            "--host", "127.0.0.1", "--port", "0", "--cache_dir", str(cache)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", DRIFT_CACHE=str(cache),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))  # fmt: skip
    proc = DriftProc(args, env)
    try:
        found = proc.wait_for(LOADED, timeout=600)
        proc.wait_for(r"join token: ", timeout=120)  # serving
        serving = vmrss(proc.popen.pid)
    finally:
        proc.kill()
    estimate = sum(block_weight_bytes(config, torch.float32, quant)[start:end]) / MIB
    return Run(quant, start, end, float(found[2]), float(found[3]), float(found[1]), serving,
               estimate)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--quants", nargs="+", default=["none", "int8", "nf4"])
    parser.add_argument("--spans", nargs="+", default=["0:30", "0:10"],
                        help="START:END spans, each run with every quantization")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the runs here")
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="drift-bench-memory-"))
    ckpt = open_checkpoint(args.model, cache_dir=cache, dtype=torch.float32)  # convert once
    print(f"{ckpt.name}: {ckpt.config.num_hidden_layers} blocks, cache {cache}")
    runs = []
    for span in args.spans:
        start, end = (int(x) for x in span.split(":"))
        for quant in args.quants:
            runs.append(measure(args.model, cache, quant, start, end, ckpt.config))
            r = runs[-1]
            print(f"  {quant:5s} [{start:2d}, {end:2d}): RSS {r.rss_before_mib:6.1f} -> "
                  f"{r.rss_after_mib:6.1f} MiB, weights {r.weights_mib:6.1f} MiB "
                  f"(estimate {r.estimate_mib:6.1f}), serving VmRSS {r.vmrss_serving_mib:6.1f} "
                  "MiB", flush=True)  # fmt: skip
    report(runs)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0 if check(runs, int(ckpt.config.num_hidden_layers)) else 1


def report(runs: list[Run]) -> None:
    base = {(r.start_block, r.end_block): r for r in runs if r.quant == "none"}
    print("\n| quantization | blocks | weights (RSS after - before) | vs float32 | estimate |")
    print("| --- | --- | --- | --- | --- |")
    for r in runs:
        ref = base.get((r.start_block, r.end_block))
        ratio = f"{r.weights_mib / ref.weights_mib:.2f}x" if ref else "-"
        print(f"| {r.quant} | [{r.start_block}, {r.end_block}) | {r.weights_mib:.1f} MiB | "
              f"{ratio} | {r.estimate_mib:.1f} MiB |")  # fmt: skip


def check(runs: list[Run], num_blocks: int) -> bool:
    """The issue's targets, where the runs cover them; prints each verdict."""
    ok = True
    full = {r.quant: r for r in runs if r.blocks == num_blocks}
    if "none" in full:
        for quant, limit in (("int8", 0.35), ("nf4", 0.2)):
            if quant in full:
                ratio = full[quant].weights_mib / full["none"].weights_mib
                good = ratio <= limit
                ok &= good
                print(f"{quant}: {ratio:.3f}x float32 over all {num_blocks} blocks "
                      f"(target <= {limit}): {'ok' if good else 'MISSED'}")  # fmt: skip
    for r in runs:
        whole = full.get(r.quant)
        if whole is not None and r.blocks < num_blocks:
            ratio = r.weights_mib / whole.weights_mib
            share = r.blocks / num_blocks
            good = abs(ratio - share) <= 0.25 * share
            ok &= good
            print(f"{r.quant}: {r.blocks} of {num_blocks} blocks use {ratio:.3f}x the weight "
                  f"memory of all {num_blocks} (share {share:.3f}, within 25%): "
                  f"{'ok' if good else 'MISSED'}")  # fmt: skip
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
