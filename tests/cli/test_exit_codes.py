"""One exit-code convention for every command (drift.cli._exits): 0 ok, 1 runtime failure,
2 usage error, 130 interrupted -- checked on real `python -m drift` processes.

Usage errors: an unknown flag and a bad value. Runtime failures: a peer on a closed loopback
port, a busy port, a model that does not exist, a process that survives `drift down`.
Interrupts: SIGINT while the command waits on a peer that accepts and never answers, while
it loads, or while it serves. Every message is one line, never a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from drift.identity import Identity
from tests.procs import DriftProc

ROOT = Path(__file__).resolve().parents[2]
PEER = Identity.generate().peer_id
COMMANDS = ("up", "down", "demo", "generate", "status", "dht", "server", "api")


def drift_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRIFT_")}
    return dict(env, PYTHONPATH=str(ROOT), DRIFT_CACHE=str(cache), OMP_NUM_THREADS="1",
                XDG_CONFIG_HOME=str(cache / "no-config"), HF_HUB_OFFLINE="1", **extra)  # fmt: skip


def drift(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "drift", *args], env=drift_env(cache),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def token(port: int) -> str:
    return f"drift://{PEER}@127.0.0.1:{port}?tls=off"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


class HungPeer:
    """A loopback TCP listener that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        self.accepted = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def hung_peer() -> Iterator[HungPeer]:
    peer = HungPeer()
    yield peer
    peer.close()


def one_line_message(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert stderr.strip(), "no message"


# --- 2: usage errors ---------------------------------------------------------------------

BAD_VALUES = {
    "up": ["--block_indices", "nonsense"],
    "down": ["--timeout", "soon"],
    "demo": ["--num_servers", "0"],
    "generate": ["hello", "--initial_peers", token(1), "--max_new_tokens", "0"],
    "status": ["--initial_peers", "not-a-token"],
    "dht": ["--fanout", "0", "--port", "0"],
    "server": ["--max_batch_size", "0", "--port", "0"],
    "api": ["--port", "0"],  # neither --initial_peers nor --local
}


@pytest.mark.parametrize("command", COMMANDS)
def test_usage_errors_exit_2(tmp_path: Path, command: str) -> None:
    unknown = drift(tmp_path, command, "--no_such_flag")
    assert unknown.returncode == 2 and "error:" in unknown.stderr, unknown.stderr
    bad = drift(tmp_path, command, *BAD_VALUES[command])
    assert bad.returncode == 2, bad.stdout + bad.stderr
    one_line_message(bad.stderr)
    bad_level = drift(tmp_path, command, "--log_level", "loud")
    assert bad_level.returncode == 2 and "LOUD" in bad_level.stderr


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    assert drift(tmp_path).returncode == 2
    assert drift(tmp_path, "--version").returncode == 0


# --- 1: runtime failures -----------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "generate"])
def test_unreachable_peer_exits_1(tmp_path: Path, command: str) -> None:
    args = ["hello"] if command == "generate" else []
    out = drift(tmp_path, command, *args, "--initial_peers", token(closed_port()))
    assert out.returncode == 1, out.stdout + out.stderr
    one_line_message(out.stderr)
    assert f"drift {command}: no initial peer answered" in out.stderr


@pytest.mark.parametrize("command", ["dht", "server", "up", "api"])
def test_busy_port_exits_1_with_one_line(tmp_path: Path, busy_port: int, command: str) -> None:
    extra = ["--no_auth", "--local"] if command == "api" else ["--plain_http"]
    out = drift(tmp_path, command, "--host", "127.0.0.1", "--port", str(busy_port), *extra)
    assert out.returncode == 1, out.stdout + out.stderr
    one_line_message(out.stderr)
    assert f"port {busy_port}" in out.stderr and "--port" in out.stderr


def test_api_on_a_model_without_a_tokenizer_exits_1(tmp_path: Path) -> None:
    from tests.tiny_models import save_tiny

    model = save_tiny("llama", tmp_path / "tiny")  # weights and config, no tokenizer files
    out = drift(tmp_path, "api", str(model), "--local", "--no_auth", "--port", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    one_line_message(out.stderr)
    assert f"cannot load the tokenizer of tiny from {model}" in out.stderr


def test_demo_missing_model_exits_1(tmp_path: Path) -> None:
    out = drift(tmp_path, "demo", "--model", str(tmp_path / "no-such-model"))
    assert out.returncode == 1, out.stdout + out.stderr
    one_line_message(out.stderr)


def test_down_with_a_survivor_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that outlives the kill (faked: terminate/kill do nothing) is a failure."""
    from drift.cli import down
    from drift.cli.main import main
    from drift.cli.procs import process_record

    monkeypatch.setattr(down, "terminate", lambda record: None)
    monkeypatch.setattr(down, "kill", lambda record: None)
    monkeypatch.setattr(down, "wait_for_exit", lambda record, timeout_s: False)
    with process_record("dht", cache_dir=tmp_path):  # this test process, "running"
        assert main(["down", "--cache_dir", str(tmp_path), "--timeout", "0"]) == 1


# --- 130: interrupted --------------------------------------------------------------------


def interrupt(proc: DriftProc) -> int:
    proc.popen.send_signal(signal.SIGINT)
    try:
        return proc.popen.wait(timeout=120)
    finally:
        proc.kill()


def start(cache: Path, *args: str) -> DriftProc:
    """`python -m drift *args` (the package's own entry point)."""
    return DriftProc(list(args), drift_env(cache), module="drift")


def rest_of(proc: DriftProc) -> str:
    assert proc.popen.poll() is not None
    lines = list(proc.log)
    while not proc.lines.empty():
        lines.append(proc.lines.get())
    return "".join(lines)


@pytest.mark.parametrize("command", ["status", "generate", "server"])
def test_sigint_while_waiting_on_a_peer_exits_130(tmp_path: Path, hung_peer: HungPeer,
                                                  command: str) -> None:  # fmt: skip
    args = {"status": ["--timeout", "600"], "generate": ["hello"],
            "server": ["--host", "127.0.0.1", "--port", "0", "--plain_http"]}[command]  # fmt: skip
    proc = start(tmp_path, command, *args, "--initial_peers", token(hung_peer.port))
    try:
        assert hung_peer.accepted.wait(120), "the command never dialled the peer"
    finally:
        code = interrupt(proc)
    out = rest_of(proc)
    assert code == 130, out
    assert "Traceback" not in out and f"drift {command}: interrupted" in out


def test_sigint_while_serving_exits_130_after_leaving(tmp_path: Path) -> None:
    proc = start(tmp_path, "dht", "--host", "127.0.0.1", "--port", "0", "--plain_http")
    try:
        proc.wait_for("join token", timeout=120)
    finally:
        code = interrupt(proc)
    out = rest_of(proc)
    assert code == 130 and "leaving the swarm" in out and "Traceback" not in out, out


def test_sigterm_while_serving_is_a_clean_stop(tmp_path: Path) -> None:
    proc = start(tmp_path, "dht", "--host", "127.0.0.1", "--port", "0", "--plain_http")
    try:
        proc.wait_for("join token", timeout=120)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=120) == 0
    finally:
        proc.kill()


def test_an_interrupt_inside_exec_of_a_string_still_exits_130(tmp_path: Path) -> None:
    """CPython marks a KeyboardInterrupt that leaves `exec(str)` (dataclasses, namedtuple:
    any import) as unhandled and ends the process by SIGINT (-2) though it was caught; a
    Ctrl+C landing in an import made `drift api` end that way (seen in CI)."""
    (tmp_path / "exec_interrupt.py").write_text(
        "import argparse, sys\n"
        "from drift.cli._exits import run_command\n"
        "command = lambda args: exec('raise KeyboardInterrupt')\n"
        "sys.exit(run_command(argparse.Namespace(command='x', func=command)))\n"
    )
    env = dict(drift_env(tmp_path), PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    # run with -m, as `python -m drift` is: `-c` and scripts exit through another path
    out = subprocess.run([sys.executable, "-m", "exec_interrupt"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 130, out.stderr
    assert "drift x: interrupted" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["up", "demo", "api"])
def test_sigint_while_loading_exits_130(tmp_path: Path, command: str) -> None:
    """Ctrl+C during startup (opening the model, starting servers): 130, no traceback."""
    from tests.tiny_models import save_tiny

    model = str(save_tiny("llama", tmp_path / "tiny"))
    if command == "api":  # so that an api that loaded before the signal goes on to serve
        from tests.api.apps import char_tokenizer

        char_tokenizer().save_pretrained(model)
    args, line = {
        "up": (["up", model, "--port", "0", "--plain_http", "--host", "127.0.0.1"], "opening"),
        "demo": (["demo", "--model", model, "--num_servers", "1"], "starting server 1/1"),
        "api": (["api", model, "--local", "--no_auth", "--port", "0"], "loading"),
    }[command]
    proc = start(tmp_path, *args)
    try:
        proc.wait_for(re.escape(line), timeout=120)
    finally:
        code = interrupt(proc)
    out = rest_of(proc)
    assert code == 130, out
    assert "Traceback" not in out and f"drift {command}: interrupted" in out
    # nothing it started outlives it (drift demo's servers run with --cache_dir tmp_path)
    import psutil

    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(tmp_path) in " ".join(p.info["cmdline"] or []) and p.pid != proc.popen.pid:
                left.append(p)
        except psutil.Error:
            continue
    for p in left:
        p.kill()
    assert not left, [p.info["cmdline"] for p in left]


def test_sigint_while_down_waits_exits_130(tmp_path: Path) -> None:
    """`drift down` waiting for a process that ignores SIGTERM: Ctrl+C ends the wait."""
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('ready', flush=True); time.sleep(600)"],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        from dataclasses import asdict

        from drift.cli.procs import ProcessRecord, _write_atomic, process_start_time, run_dir

        record = ProcessRecord("dht", stubborn.pid, process_start_time(stubborn.pid),
                               ["drift"], None, None, 0.0)  # fmt: skip
        _write_atomic(run_dir(tmp_path) / record.file_name(), asdict(record))
        proc = start(tmp_path, "down", "--timeout", "600")
        try:
            proc.wait_for("stopping", timeout=120)
        finally:
            code = interrupt(proc)
        out = rest_of(proc)
        assert code == 130 and "drift down: interrupted" in out and "Traceback" not in out, out
    finally:
        stubborn.kill()
        stubborn.wait()
