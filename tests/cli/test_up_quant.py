"""`drift up --quant_type nf4` as a real process: sized by nf4's per-block cost, announced as
nf4, shown by `drift status` (SmolLM2 weights; slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from drift.models.checkpoint import open_checkpoint
from drift.models.footprint import block_weight_bytes
from tests.procs import DriftProc

pytestmark = pytest.mark.slow
pytest.importorskip("bitsandbytes")


def test_up_nf4_sizes_and_announces_the_quantized_span(
    smollm2_cache: Path, tmp_path: Path, drift_procs: list[DriftProc]
):
    env = dict(os.environ, DRIFT_CACHE=str(smollm2_cache), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", PYTHONPATH=str(Path.cwd()))  # fmt: skip
    args = ["up", "smollm2", "--quant_type", "nf4", "--host", "127.0.0.1", "--port", "0",
            "--identity_path", str(tmp_path / "id.key"), "--throughput", "100",
            "--attn_cache_tokens", "1024", "--plain_http"]  # fmt: skip
    proc = DriftProc(args, env)
    drift_procs.append(proc)
    memory = proc.wait_for(r"memory: (\d+) of \d+ blocks fit in .*: ([\d.]+) MiB weights")
    config = open_checkpoint("smollm2", cache_dir=smollm2_cache).config
    nf4 = block_weight_bytes(config, torch.float32, "nf4")[0] / 2**20
    float32 = block_weight_bytes(config, torch.float32, "none")[0] / 2**20
    assert float(memory[2]) == pytest.approx(nf4, abs=0.05) and nf4 < float32 / 6
    resident = proc.wait_for(r"take ([\d.]+) MiB resident")  # the server's own RSS delta
    blocks = int(memory[1])
    assert float(resident[1]) < blocks * nf4 * 1.3 + 16  # + bitsandbytes' fixed state
    proc.wait_for(r"\(quantization: nf4\)")
    port = int(proc.wait_for(r"serving blocks \[0, \d+\) on port (\d+)")[1])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/blocks", timeout=10) as resp:
        info = json.load(resp)
    assert info["quant"] == "nf4" and info["dtype"] == "float32"
    assert info["end_block"] - info["start_block"] == blocks
    token = proc.wait_for(r"drift up \S+ --join (drift://\S+)")[1]
    status = subprocess.run([sys.executable, "-m", "drift.cli", "status", "--initial_peers",
                             token], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert status.returncode == 0, status.stderr
    row = next(ln for ln in status.stdout.splitlines() if re.search(r"\[0, \d+\)", ln))
    assert "float32 nf4" in row
