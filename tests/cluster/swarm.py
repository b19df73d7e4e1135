"""Helpers for tests and benchmarks on a cluster box: start `drift up` machines, watch coverage.

`start_swarm` runs `drift up MODEL` on the first machine and, once it prints its join
command, `drift up MODEL --join TOKEN` on the others; `wait_covered` polls the swarm (read
from this process, as a client would) until every block is served.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from drift.identity import JoinToken, parse_join_token
from drift.swarm import PeerRecord
from drift.swarm.reader import read_swarm_blocking
from tests.cluster.box import Machine
from tests.procs import DriftProc

JOIN_RE = re.compile(r"drift up \S+ --join (\S+)")
PEER_RE = re.compile(r"^peer id (\S+)")
MEMORY_RE = re.compile(r"^memory: (.*)")
BUDGET_RE = re.compile(r"^\s+(budget .*)")


@dataclass
class Started:
    machine: Machine
    proc: DriftProc
    peer_id: str
    memory_line: str  # what drift up said about the blocks that fit
    budget_line: str  # ... and the budget it read (which figure)


def start_one(m: Machine, model: str, *args: str) -> Started:
    proc = m.up(model, *args)
    peer = proc.wait_for(PEER_RE, timeout=120).group(1)
    memory = proc.wait_for(MEMORY_RE, timeout=240).group(1)
    return Started(m, proc, peer, memory, proc.wait_for(BUDGET_RE, timeout=10).group(1))


def start_swarm(machines: list[Machine], model: str, *args: str,
                ) -> tuple[JoinToken, list[Started]]:  # fmt: skip
    """The first machine starts the swarm; the others join with the command it printed."""
    first = start_one(machines[0], model, *args)
    token_text = first.proc.wait_for(JOIN_RE, timeout=300).group(1)
    token = parse_join_token(token_text)
    joiners = [m.up(model, "--join", token_text) for m in machines[1:]]  # as printed
    started = [first]
    for m, proc in zip(machines[1:], joiners, strict=True):
        peer = proc.wait_for(PEER_RE, timeout=120).group(1)
        memory = proc.wait_for(MEMORY_RE, timeout=300).group(1)
        budget = proc.wait_for(BUDGET_RE, timeout=10).group(1)
        started.append(Started(m, proc, peer, memory, budget))
    return token, started


def servers(token: JoinToken) -> list[PeerRecord]:
    snap = read_swarm_blocking([token], timeout_s=5)
    return [r for r in snap.live() if r.role == "server" and r.state == "online" and r.span]


def covered(records: list[PeerRecord], num_blocks: int) -> bool:
    held = {b for r in records if r.span for b in range(*r.span)}
    return held >= set(range(num_blocks))


def wait_covered(token: JoinToken, num_blocks: int, want: set[str],
                 timeout: float = 240) -> dict[str, tuple[int, int]]:  # fmt: skip
    """Until the servers in `want` are online and cover every block: peer id -> span."""
    deadline = time.monotonic() + timeout
    seen: list[PeerRecord] = []
    while time.monotonic() < deadline:
        try:
            seen = servers(token)
        except Exception:  # a node still starting
            seen = []
        spans = {r.peer_id: r.span for r in seen if r.span}
        if want <= set(spans) and covered(seen, num_blocks):
            return spans  # type: ignore[return-value]
        time.sleep(0.5)
    raise AssertionError(f"not covered after {timeout}s: {[(r.peer_id, r.span) for r in seen]}")
