"""`drift up --print-service systemd|launchd`: the unit / agent runs the same node with its
identity and restarts it (systemd-analyze verify passes it, a broken one it flags), and
`drift down` leaves a node a service runs to its manager, naming the command that stops it."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drift.cli.procs import read_records
from tests.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[2]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIFT_")}
    return dict(env, DRIFT_CACHE=str(cache), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)


def _drift(cache: Path, *args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drift.cli", *args], env=_env(cache, **env),
                          cwd=cwd, capture_output=True, text=True, timeout=120)  # fmt: skip


def _exec_start(unit: str) -> str:
    [line] = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=")


def test_systemd_unit_runs_the_node_with_its_identity(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    out = _drift(cache, "up", "smollm2", "--port", "31400", "--print-service", "systemd",
                 "--num_blocks", "3", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    unit = out.stdout
    cmd = _exec_start(unit)
    assert cmd.startswith(f"{sys.executable} -m drift.cli up smollm2 --port 31400 --num_blocks 3")
    assert f"--identity_path {cache / 'identity.key'} --cache_dir {cache}" in cmd
    assert "--print-service" not in cmd and " systemd " not in cmd
    assert "Restart=always" in unit and f"WorkingDirectory={tmp_path}" in unit
    assert "Environment=DRIFT_SERVICE=systemd:drift-node.service" in unit
    assert f"Environment=DRIFT_CACHE={cache}" in unit
    assert "journalctl --user -u drift-node" in unit
    assert not (cache / "identity.key").exists(), "printing starts nothing, creates nothing"


def test_service_name_and_quoting(tmp_path: Path) -> None:
    model = tmp_path / "my models" / "100%"
    out = _drift(tmp_path, "up", str(model), "--print-service=systemd", "--service_name",
                 "drift-b", "--identity_path", "id.key")  # fmt: skip
    assert out.returncode == 0, out.stderr
    cmd = _exec_start(out.stdout)
    assert f'"{tmp_path}/my models/100%%"' in cmd
    assert f"--identity_path {ROOT / 'id.key'}" in cmd  # made absolute
    assert "DRIFT_SERVICE=systemd:drift-b.service" in out.stdout


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "drift-node.service"
    path.write_text(unit_text)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return subprocess.run(["systemd-analyze", "--user", "verify", str(path)],
                          env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)),
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (Debian: apt-get install systemd)")  # fmt: skip
def test_systemd_analyze_verify_passes_the_unit(tmp_path: Path) -> None:
    out = _drift(tmp_path / "cache", "up", "smollm2", "--print-service", "systemd")
    assert out.returncode == 0, out.stderr
    ok = _verify(out.stdout, tmp_path)
    assert ok.returncode == 0 and not ok.stderr.strip(), ok.stderr
    # verify's warnings (rc stays 0) are what a broken unit produces: the check can fail
    bad = _verify(out.stdout.replace("Restart=always", "Restart=sometimes"), tmp_path)
    assert "restart specifier" in bad.stderr or bad.returncode != 0


def test_launchd_agent(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    out = _drift(cache, "up", "smollm2", "--print-service", "launchd", "--service_name",
                 "org.example.drift")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("<?xml")
    agent = plistlib.loads(out.stdout.encode())
    assert agent["Label"] == "org.example.drift"
    assert agent["KeepAlive"] is True and agent["RunAtLoad"] is True
    assert agent["ProgramArguments"][:5] == [sys.executable, "-m", "drift.cli", "up", "smollm2"]
    assert agent["ProgramArguments"][-4:] == ["--identity_path", str(cache / "identity.key"),
                                              "--cache_dir", str(cache)]  # fmt: skip
    assert agent["EnvironmentVariables"]["DRIFT_SERVICE"] == "launchd:org.example.drift"
    assert agent["StandardOutPath"].endswith("Library/Logs/org.example.drift.log")
    assert "launchctl bootout gui/$(id -u)/org.example.drift" in out.stdout


def test_inline_swarm_key_is_never_written_into_a_unit(tmp_path: Path) -> None:
    flag = _drift(tmp_path, "up", "smollm2", "--print-service", "systemd",
                  "--swarm_key", "s3cret-key-value-0123456789")  # fmt: skip
    env = _drift(tmp_path, "up", "smollm2", "--print-service", "systemd",
                 DRIFT_SWARM_KEY="s3cret-key-value-0123456789")  # fmt: skip
    for out in (flag, env):
        assert out.returncode == 2 and out.stdout == ""
        assert "--swarm_key_file" in out.stderr and "s3cret" not in out.stderr


def _wait_record(cache: Path, proc: subprocess.Popen, kind: str = "up"):
    for _ in range(600):  # polls, not a timed assertion: the loop ends when the record is there
        records = [r for _, r in read_records(cache) if r is not None and r.kind == kind]
        if records:
            return records[0]
        assert proc.poll() is None, "the node exited before writing its record"
        time.sleep(0.1)
    raise AssertionError("no process record")


@pytest.mark.timeout(180)
def test_down_leaves_a_service_node_to_its_manager(tmp_path: Path, popens) -> None:
    model = save_tiny("llama", tmp_path / "llama")
    cache = tmp_path / "cache"
    node = subprocess.Popen(
        [sys.executable, "-m", "drift.cli", "up", str(model), "--host", "127.0.0.1", "--port",
         "0", "--plain_http", "--start_delay", "0"],
        env=_env(cache, DRIFT_SERVICE="systemd:drift-b.service"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    popens.append(node)
    record = _wait_record(cache, node)
    assert record.extra["service"] == "systemd:drift-b.service"
    listed = _drift(cache, "down", "--list")
    assert "service systemd:drift-b.service" in listed.stdout
    down = _drift(cache, "down")
    assert down.returncode == 1
    assert "stop it there: systemctl --user stop drift-b" in down.stdout
    assert node.poll() is None, "drift down stopped a node its service would restart"
