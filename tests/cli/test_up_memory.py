"""`drift up` sized by its budget, as real subprocesses: it refuses in one line when not one
block fits, names the cgroup it read, and the join command it prints works as printed (the
joiner serves the swarm's dtype and quantization)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from drift.cli.up import swarm_format
from drift.identity import Identity
from drift.swarm import PeerRecord
from tests.procs import DriftProc
from tests.tiny_models import save_tiny

JOIN_RE = re.compile(r"^\s+(drift up \S+ --join drift://\S+)\s*$")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("models") / "tiny-llama")


def _env(tmp_path: Path, name: str, **extra: str) -> dict[str, str]:
    """A 'machine' of its own: its cache dir and a config file that keeps it on loopback."""
    home = tmp_path / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "drift.toml").write_text('[up]\nhost = "127.0.0.1"\nport = 0\nstart_delay = 0\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIFT_")}
    return dict(env, DRIFT_CACHE=str(home / "cache"), DRIFT_CONFIG=str(home / "drift.toml"),
                OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(Path.cwd()),
                **extra)  # fmt: skip


def _record(peer: str, dtype: str, quant: str) -> PeerRecord:
    return PeerRecord(peer, ("http://127.0.0.1:1",), "server", "m", "f", 4, 0, 4, "online", dtype,
                      quant, 1.0, 0, 0, 0, "0", 1, 0.0)  # fmt: skip


def test_swarm_format_is_what_most_servers_run() -> None:
    peers = [Identity.generate().peer_id for _ in range(3)]
    records = [_record(peers[0], "bfloat16", "nf4"), _record(peers[1], "bfloat16", "nf4"),
               _record(peers[2], "float32", "none")]  # fmt: skip
    assert swarm_format(records) == ("bfloat16", "nf4")
    assert swarm_format([]) is None


def test_up_refuses_in_one_line_when_not_one_block_fits(tiny: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, "small")
    out = subprocess.run([sys.executable, "-m", "drift.cli", "up", str(tiny), "--max_memory",
                          "1MiB"], env=env, text=True, capture_output=True, timeout=180)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "not even one block fits" in lines[0], out.stderr
    assert "--max_memory" in lines[0] and "budget" in lines[0]
    assert "loading blocks" not in out.stdout


def test_the_printed_join_command_works_as_printed(tiny: Path, tmp_path: Path,
                                                   drift_procs: list[DriftProc]) -> None:  # fmt: skip
    first = ["up", str(tiny), "--torch_dtype", "bfloat16", "--num_blocks", "2",
             "--max_memory", "64GiB"]  # fmt: skip
    drift_procs.append(DriftProc(first, _env(tmp_path, "a")))
    drift_procs[0].wait_for(r"memory:|loaded blocks")
    command = drift_procs[0].wait_for(JOIN_RE).group(1)
    argv = shlex.split(command)
    assert argv[:2] == ["drift", "up"] and "--torch_dtype" not in argv
    drift_procs.append(DriftProc(argv[1:], _env(tmp_path, "b")))  # exactly as printed
    drift_procs[1].wait_for(r"serving as the swarm does: --torch_dtype bfloat16 --quant_type none")
    loaded = drift_procs[1].wait_for(r"loaded blocks \[(\d+), (\d+)\) of .* as (\w+)")
    assert loaded.group(3) == "bfloat16"
    drift_procs[0].wait_for(r"all 4 blocks are served")


V1_ROOT = Path("/sys/fs/cgroup/memory")


def test_up_in_a_real_cgroup_v1_says_it_read_the_cgroup(tiny: Path, tmp_path: Path) -> None:
    """Root with a cgroup v1 memory hierarchy (this CI host): `drift up` in a 2 GiB cgroup."""
    if os.geteuid() != 0 or not (V1_ROOT / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    group = V1_ROOT / f"drift-test-up-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(2 << 30))
    env = _env(tmp_path, "c")
    script = f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m drift.cli up {tiny}"
    proc = subprocess.Popen(["sh", "-c", script], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  budget") or "loaded blocks" in line:
                break
        text = "".join(lines)
        assert re.search(rf"budget [\d.]+ GiB from cgroup v1 {group}: memory.limit_in_bytes "
                         r"2.00 GiB", text), text  # fmt: skip
        assert "memory: 4 of 4 blocks fit" in text
    finally:
        proc.kill()
        proc.wait(timeout=30)
        group.rmdir()
