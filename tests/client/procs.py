"""`drift server` subprocesses on loopback for client tests: start, read peer id/token, kill.

Output lines, `wait_for` and `kill` come from tests/procs.py; every process is killed by the
test (fixture) that started it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from drift.identity.tokens import parse_join_tokens
from drift.swarm.reader import read_swarm_blocking
from tests.procs import DriftProc

PEER_RE = re.compile(r"peer id (\S+) listening on 127\.0\.0\.1:(\d+)")
TOKEN_RE = re.compile(r"join token: (drift://\S+)")


class ServerProc(DriftProc):
    """One `drift server MODEL --block_indices A:B` process."""

    def __init__(self, model_dir: Path, start: int, end: int, workdir: Path,
                 initial_peers: str | None = None) -> None:  # fmt: skip
        workdir.mkdir(parents=True, exist_ok=True)
        args = ["server", str(model_dir),
                "--block_indices", f"{start}:{end}", "--host", "127.0.0.1", "--port", "0",
                "--throughput", "100", "--gossip_interval", "0.5", "--record_ttl", "5",
                "--device", "cpu", "--torch_dtype", "float32",
                "--identity_path", str(workdir / "id.key"), "--cache_dir", str(workdir)]  # fmt: skip
        if initial_peers:
            args += ["--initial_peers", initial_peers]
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   PYTHONPATH=str(Path.cwd()))  # fmt: skip
        super().__init__(args, env)
        self.peer_id = ""
        self.port = 0
        self.token = ""

    def wait_started(self) -> ServerProc:
        found = self.wait_for(PEER_RE, timeout=120)
        self.peer_id, self.port = found.group(1), int(found.group(2))
        self.token = self.wait_for(TOKEN_RE, timeout=120).group(1)
        return self

    def swarm_peers(self) -> set[str]:
        """Peer ids of online servers in this process's GET /swarm (over TLS, checked
        against its peer id)."""
        snap = read_swarm_blocking(parse_join_tokens(self.token), timeout_s=10)
        return {r.peer_id for r in snap.live() if r.state == "online" and r.end_block is not None}

    def wait_members(self, peer_ids: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not peer_ids <= self.swarm_peers():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.swarm_peers()} lacks some of {peer_ids}")
            time.sleep(0.1)
