"""Swarm members as real processes for fault tests: start, freeze, kill, restart.

Each is `python -m drift.cli dht|server ... --tls` on 127.0.0.1 with its own identity file
and fixed port, so a restart keeps its peer id and address. Output lines and kill come from
tests/procs.py; every process is stopped by the fixture that started it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from drift.identity import JoinToken, parse_join_token
from drift.swarm.dial import peer_ssl
from drift.swarm.reader import read_swarm_blocking
from tests.procs import DriftProc
from tests.server.harness import tokens_total as read_tokens

TOKEN_RE = re.compile(r"join token: (drift://\S+)")
RECORD_TTL_S = 5.0  # short enough to watch expiry, long enough for a loaded 2-core machine
FAST = ["--gossip_interval", "0.4", "--record_ttl", str(RECORD_TTL_S)]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PrefixedProc(DriftProc):
    """A DriftProc run under a command prefix (e.g. `ip netns exec <ns>`)."""

    def __init__(self, prefix: list[str], args: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(
            [*prefix, sys.executable, "-m", "drift.cli", *args], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()


class Member:
    """One swarm member process (restartable with the same identity and port)."""

    def __init__(self, name: str, workdir: Path, args: list[str], *, host: str = "127.0.0.1",
                 prefix: list[str] | None = None) -> None:  # fmt: skip
        self.name, self.workdir, self.prefix = name, workdir, prefix
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.args = [*args, "--host", host, "--port", str(self.port), "--tls", *FAST,
                     "--identity_path", str(workdir / "id.key"), "--cache_dir", str(workdir)]  # fmt: skip
        self.proc: DriftProc | None = None
        self.token: JoinToken | None = None
        self.launched_at = 0.0  # time.time() of the latest launch (wait_online's `since`)

    @property
    def peer_id(self) -> str:
        assert self.token is not None
        return self.token.peer_id

    def launch(self) -> Member:
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(Path.cwd()))
        self.launched_at = time.time()
        self.proc = (DriftProc(self.args, env) if self.prefix is None
                     else PrefixedProc(self.prefix, self.args, env))  # fmt: skip
        return self

    def wait_started(self) -> Member:
        assert self.proc is not None
        self.token = parse_join_token(self.proc.wait_for(TOKEN_RE, timeout=180).group(1))
        return self

    def start(self) -> Member:
        return self.launch().wait_started()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.popen.send_signal(signal.SIGSTOP)

    def stopped(self) -> bool:
        """Whether the process is frozen (SIGSTOP): state T in /proc (Linux)."""
        if self.proc is None or self.proc.popen.poll() is not None:
            return False
        stat = Path(f"/proc/{self.proc.popen.pid}/stat")
        return stat.is_file() and stat.read_text().rpartition(")")[2].split()[0] in ("T", "t")

    def thaw(self) -> float:
        """SIGCONT; the time.time() it was sent (wait_online's `since`: its re-signed record)."""
        assert self.proc is not None
        self.proc.popen.send_signal(signal.SIGCONT)
        return time.time()


def server(name: str, workdir: Path, model_dir: Path, start: int, end: int,
           seed: Member | None = None, **where: object) -> Member:  # fmt: skip
    args = ["server", str(model_dir), "--block_indices", f"{start}:{end}", "--throughput", "100",
            "--device", "cpu", "--torch_dtype", "float32"]  # fmt: skip
    if seed is not None:
        args += ["--initial_peers", str(seed.token)]
    return Member(name, workdir / name, args, **where)  # type: ignore[arg-type]


def dht(name: str, workdir: Path, **where: object) -> Member:
    return Member(name, workdir / name, ["dht"], **where)  # type: ignore[arg-type]


def online(token: JoinToken, since: float = 0.0) -> set[str]:
    """Peer ids of online servers in the table of the node behind `token` whose record was
    signed after `since` (a time.time(); 0: any)."""
    snap = read_swarm_blocking([token], timeout_s=5)
    return {r.peer_id for r in snap.live()
            if r.state == "online" and r.span is not None and r.seq >= since * 1e6}  # fmt: skip


def wait_online(token: JoinToken, peer_ids: set[str], timeout: float = 60,
                absent: set[str] = frozenset(),  # type: ignore[assignment]
                since: float = 0.0) -> None:  # fmt: skip
    """Until the node behind `token` lists every peer in `peer_ids` online (and none of
    `absent`), each by a record signed after `since`. A member (re)started or thawed at `t`
    is waited for with `since=t`: records count the microseconds of their signing as `seq`
    (drift.node.membership), and the record of its previous run can still be live for a
    record TTL after it died: online by that one, it is not back yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            seen = online(token, since)
        except Exception:  # the node may be restarting
            seen = set()
        if peer_ids <= seen and not absent & seen:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{token} lists {sorted(seen)}, wanted {sorted(peer_ids)} "
                                 f"and not {sorted(absent)}")  # fmt: skip
        time.sleep(0.2)


def tokens_total(m: Member) -> int:
    """The member's drift_tokens_total, from its /metrics over TLS bound to its peer id."""
    return asyncio.run(read_tokens(f"https://127.0.0.1:{m.port}", ssl=peer_ssl(m.peer_id)))


def describe(seed: Member, members: list[Member], tail: int = 40) -> str:
    """What a failed fault test needs to know: the seed's record of each member (state,
    span, degraded, draining, seconds to expiry) and the last lines of each member's output."""
    out: list[str] = []
    try:
        snap = read_swarm_blocking([seed.token], timeout_s=5)  # type: ignore[list-item]
        now = time.time()
        held = {r.peer_id: r for r in snap.records}
        for m in [seed, *members]:
            r = held.get(m.peer_id) if m.token is not None else None
            out.append(f"{m.name}: " + ("no record at the seed" if r is None else
                       f"{r.state} span={r.span} degraded_s={r.optional('degraded_s')} "
                       f"draining={r.optional('draining')} expires_in={r.expires_at - now:.1f}s"))  # fmt: skip
    except Exception as exc:  # noqa: BLE001 -- the seed may be the thing that died
        out.append(f"could not read the seed's table: {exc!r}")
    names = sorted(t.name.rstrip("0123456789_-") for t in threading.enumerate())
    counts = {n: names.count(n) for n in dict.fromkeys(names)}
    out.append(f"this test process runs {len(names)} threads: {counts}")
    for m in [seed, *members]:
        alive = m.proc is not None and m.proc.popen.poll() is None
        lines = m.proc.output().splitlines()[-tail:] if m.proc is not None else []
        out.append(f"--- {m.name} ({'running' if alive else 'not running'}), last lines:")
        out.extend(lines)
    return "\n".join(out)
