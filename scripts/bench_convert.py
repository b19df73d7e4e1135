"""Peak resident memory of converting a GGUF file (DRIFT's streaming conversion).

Runs the conversion in a fresh child process that first imports what any DRIFT process
that converts has loaded (torch, transformers and the model family's modeling code), then
samples its own RSS every 2 ms while `open_checkpoint` converts into an empty cache. Prints
the RSS before, the peak, the peak increase, and the converted weights' size; the target is
a peak increase below 2x the bfloat16 output. The child's absolute peak is printed too
(most of it is the interpreter, torch and transformers, present before any conversion).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_convert.py               # SmolLM2 bf16
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_convert.py --dtype float32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20

CHILD = r"""
import importlib, json, sys, threading, time
from pathlib import Path
import torch
from transformers.integrations.gguf.reader import read_gguf_metadata
from drift.models.checkpoint import open_checkpoint
from drift.models.sources.aliases import find_alias, resolve_alias

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

model, cache, dtype = sys.argv[1], Path(sys.argv[2]), getattr(torch, sys.argv[3])
# What a converting process holds anyway: the family's modeling code (the conversion builds
# the model on `meta` for transformers' name map, and a server then runs its layers).
alias = find_alias(model)
gguf = resolve_alias(alias, cache) if alias else Path(model)
arch = read_gguf_metadata(str(gguf))[0]["general.architecture"]
importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
before = rss()
peak = [before]
done = threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)

thread = threading.Thread(target=sample)
thread.start()
started = time.perf_counter()
ckpt = open_checkpoint(model, cache_dir=cache, dtype=dtype)
seconds = time.perf_counter() - started
done.set()
thread.join()
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
weights = sum(p.stat().st_size for p in ckpt.path.glob("*.safetensors"))
print(json.dumps({"before": before, "peak": max(peak[0], rss()), "vm_hwm": hwm,
                  "weights": weights, "seconds": seconds, "dir": str(ckpt.path)}))
"""


def convert_in_child(model: str, dtype: str) -> dict:
    """The child's measurements (bytes) for one conversion into a fresh cache."""
    cache = Path(tempfile.mkdtemp(prefix="drift-bench-convert-"))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", CHILD, model, str(cache), dtype], env=env,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="alias or .gguf file")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    args = parser.parse_args()
    m = convert_in_child(args.model, args.dtype)
    rise = m["peak"] - m["before"]
    print(f"{args.model} -> {args.dtype}: converted in {m['seconds']:.1f} s into {m['dir']}")
    print(f"  weights written      {m['weights'] / MIB:8.1f} MiB")
    print(f"  RSS before           {m['before'] / MIB:8.1f} MiB (interpreter, torch, transformers)")
    print(f"  RSS peak             {m['peak'] / MIB:8.1f} MiB (VmHWM {m['vm_hwm'] / MIB:.1f})")
    print(f"  peak increase        {rise / MIB:8.1f} MiB = {rise / m['weights']:.2f}x the output")
    good = rise < 2 * m["weights"]
    print(f"target: peak increase < 2x the output: {'ok' if good else 'MISSED'}")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
