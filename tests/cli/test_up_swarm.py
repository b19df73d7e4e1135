"""The machine-level commands as real subprocesses on loopback: up, up --join, status,
generate, down (SmolLM2 weights; slow). Each test uses its own cache dir via DRIFT_CACHE."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from drift.cli.procs import read_records
from tests.procs import DriftProc

PROMPT = "What is the capital of France?"
NEW_TOKENS = 12
TOKEN_RE = re.compile(r"drift up \S+ --join (drift://\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A cache dir holding SmolLM2 converted to float32 (what `drift up` runs on a CPU), once
    for all subprocesses."""
    import torch

    from drift.models.checkpoint import open_checkpoint

    directory = tmp_path_factory.mktemp("drift-cache")
    open_checkpoint("smollm2", cache_dir=directory, dtype=torch.float32)
    return directory


@pytest.fixture(scope="module")
def reference_text(cache) -> str:
    """Greedy reply of plain local transformers on the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drift.cli.generate import encode_prompt
    from drift.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint("smollm2", cache_dir=cache)
    tok = AutoTokenizer.from_pretrained(ckpt.path)
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    ids = encode_prompt(tok, PROMPT)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, pad_token_id=tok.eos_token_id)  # fmt: skip
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture
def env(cache) -> dict[str, str]:
    return dict(os.environ, DRIFT_CACHE=str(cache), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                PYTHONPATH=str(Path.cwd()))  # fmt: skip


def drift(
    env: dict[str, str], *args: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "drift.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_up_join_generate_restart_down(cache, reference_text, env, drift_procs, tmp_path):
    port1 = free_port()
    first = ["up", "smollm2", "--host", "127.0.0.1", "--port", str(port1), "--num_blocks", "15",
             "--identity_path", str(tmp_path / "a.key"), "--throughput", "100"]  # fmt: skip
    drift_procs.append(DriftProc(first, env))
    token = drift_procs[0].wait_for(TOKEN_RE).group(1)
    assert f"127.0.0.1:{port1}" in token
    drift_procs[0].wait_for(r"blocks missing: 15-29")

    second = ["up", "smollm2", "--join", token, "--host", "127.0.0.1", "--port", "0",
              "--num_blocks", "15", "--identity_path", str(tmp_path / "b.key"),
              "--throughput", "100", "--start_delay", "0.5"]  # fmt: skip
    drift_procs.append(DriftProc(second, env))
    drift_procs[1].wait_for(r"serving blocks \[15, 30\)")  # the missing half, chosen from the table
    drift_procs[0].wait_for(r"all 30 blocks are served")

    status = drift(env, "status", "--initial_peers", token)
    assert status.returncode == 0, status.stderr
    assert "all 30 blocks covered" in status.stdout and "[15, 30)" in status.stdout

    gen = drift(env, "generate", "--initial_peers", token, "--max_new_tokens", str(NEW_TOKENS),
                PROMPT)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.strip() == reference_text.strip() != ""

    # Restart the first node: same identity, same port, so the same join token.
    drift_procs[0].popen.terminate()
    assert drift_procs[0].popen.wait(timeout=60) == 0
    drift_procs[0] = DriftProc(first, env)
    assert drift_procs[0].wait_for(TOKEN_RE).group(1) == token

    listed = drift(env, "down", "--list")
    assert listed.returncode == 0
    pids = {str(p.popen.pid) for p in drift_procs}
    assert all(f"pid {pid}" in listed.stdout for pid in pids), listed.stdout

    down = drift(env, "down", "--timeout", "30")
    assert down.returncode == 0, down.stdout + down.stderr
    assert [p.popen.wait(timeout=30) for p in drift_procs] == [0, 0]
    assert read_records(cache) == []


def test_taken_port_names_the_fix(tmp_path):
    env = dict(os.environ, DRIFT_CACHE=str(tmp_path), PYTHONPATH=str(Path.cwd()))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = drift(env, "up", "--host", "127.0.0.1", "--port", str(port), "--identity_path",
                    str(tmp_path / "k.key"), timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert f"port {port}" in out.stderr and "--port" in out.stderr


def test_overlapping_spans_cover_everything():
    from drift.cli.demo import overlapping_spans

    assert overlapping_spans(30, 3) == [(0, 10), (7, 20), (17, 30)]
    assert overlapping_spans(4, 1) == [(0, 4)]
    with pytest.raises(ValueError):
        overlapping_spans(2, 3)


@pytest.mark.slow
def test_demo_answers_and_cleans_up(cache, env, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = drift({**env, "TMPDIR": str(tmp)}, "demo", "--max_new_tokens", "10",
                "What is the capital of France?", timeout=400)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Paris" in out.stdout
    spans = [
        tuple(map(int, m)) for m in re.findall(r"blocks \[\s*(\d+),\s*(\d+)\) ran on", out.stdout)
    ]
    assert spans[0][0] == 0 and spans[-1][1] == 30
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert "tokens/s" in out.stdout and "dashboard: http://127.0.0.1:" in out.stdout
    assert "stopped 3 servers" in out.stdout
    assert read_records(cache) == []
    # the only dashboard URL is printed while the servers run, none after the answer
    assert out.stdout.count("dashboard: http://127.0.0.1:") == 1
    assert "swarm ready; dashboard:" in out.stdout
    assert list(tmp.iterdir()) == [], "the demo left its work dir (identity keys, logs)"
