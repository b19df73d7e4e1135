"""A machine of a full swarm leaves and leaves blocks missing: a machine whose blocks others
also serve moves into the gap, though it has no room for both spans (drift up filled it): it
hands over, frees its old blocks, loads the missing ones. Coverage comes back with no new
machine, greedy tokens equal local transformers, and no machine is OOM-killed.

Three 0.75 GiB machines (about 7 of the 12 blocks each) started with `drift up` and the
printed join command, checking balance every ~2 s instead of ~60 s.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch
from transformers import AutoModelForCausalLM

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from drift.identity import JoinToken, parse_join_token
from drift.swarm.reader import read_swarm_blocking
from tests.cluster.box import Box
from tests.cluster.swarm import JOIN_RE, PEER_RE, Started, servers, start_one, wait_covered

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
BLOCKS = 12
FAST_BALANCE = ("--mean_balance_check_period", "2")


def where(record) -> dict:
    url = urlsplit(record.addrs[0])
    return {"host": url.hostname, "port": url.port}


def blocks(span: tuple[int, int]) -> set[int]:
    return set(range(*span))


def served(tokens: list[JoinToken]) -> set[int]:
    """Blocks the servers of `tokens` serve now (online, not draining)."""
    ids = {t.peer_id for t in tokens}
    records = [r for r in read_swarm_blocking(tokens, timeout_s=5).live() if r.peer_id in ids]
    return {b for b in range(BLOCKS) if any(r.serves(b) for r in records)}


def wait_served(tokens: list[JoinToken], timeout: float) -> set[int]:
    deadline, seen = time.monotonic() + timeout, set()
    while time.monotonic() < deadline:
        try:
            seen = served(tokens)
        except Exception:  # a read that met the killed machine
            seen = set()
        if seen == set(range(BLOCKS)):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"blocks still missing after {timeout}s: {set(range(BLOCKS)) - seen}")


def test_a_full_machine_moves_into_the_gap_a_leaving_machine_left(
    box_ok, box_model: Path, tmp_path: Path
) -> None:
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    local = AutoModelForCausalLM.from_pretrained(box_model, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=12, do_sample=False)
    del local
    with Box(3, tmp_path, memory=int(0.75 * 2**30)) as box:
        first = start_one(box.machines[0], str(box_model), "--device", "cpu", *FAST_BALANCE)
        printed = first.proc.wait_for(JOIN_RE, timeout=300).group(1)
        started = [first]
        for m in box.machines[1:]:  # one at a time: each chooses from the others' records
            proc = m.up(str(box_model), "--join", printed, *FAST_BALANCE)
            peer = proc.wait_for(PEER_RE, timeout=120).group(1)
            started.append(Started(m, proc, peer, "", ""))
            wait_covered_by(printed, {s.peer_id for s in started})
        token = parse_join_token(printed)
        spans = wait_covered(token, BLOCKS, {s.peer_id for s in started})

        # the machine to stop: its blocks are not all served by the others, and one of the
        # others serves only blocks the third serves too (so it can move without a gap)
        def movable(rest: list[Started]) -> bool:
            a, b = (blocks(spans[s.peer_id]) for s in rest)
            return a <= b or b <= a

        victim = next((s for s in started
                       if not blocks(spans[s.peer_id]) <= set().union(
                           *(blocks(spans[o.peer_id]) for o in started if o is not s))
                       and movable([o for o in started if o is not s])), None)  # fmt: skip
        assert victim is not None, f"no machine's leaving makes a gap another can fill: {spans}"
        rest = [s for s in started if s is not victim]
        # read from the machines left (the victim may be the seed of the printed token)
        records = {r.peer_id: r for r in servers(token)}
        left = [dataclasses.replace(token, peer_id=s.peer_id, **where(records[s.peer_id]))
                for s in rest]  # fmt: skip
        victim.proc.kill()
        killed_at = time.monotonic()
        missing = blocks(spans[victim.peer_id]) - set().union(*(blocks(spans[s.peer_id])
                                                                for s in rest))  # fmt: skip
        assert missing
        try:
            wait_served(left, timeout=240)
        except AssertionError as exc:
            logs = "\n".join(s.proc.output() for s in rest)
            raise AssertionError(f"{exc}; spans {spans}; output:\n{logs}") from None
        back_s = time.monotonic() - killed_at
        time.sleep(10)  # a few more balance checks: the swarm stays covered, nobody else moves
        assert served(left) == set(range(BLOCKS))
        logs = [s.proc.output() for s in rest]
        said = [f"{s.machine.name}: {line}" for s, log in zip(rest, logs, strict=True)
                for line in log.splitlines() if "moving" in line or "now serving" in line]  # fmt: skip
        assert any("no room for both" in line for line in said), logs
        assert sum("now serving" in line for line in said) == 1, said
        print(f"\nspans {spans}; killed {victim.machine.name}; every block served again after "
              f"{back_s:.1f} s;", *said, sep="\n")  # fmt: skip
        assert all(m.oom_kills() == 0 for m in box.machines)

        config = ClientConfig(swarm_refresh_s=0.2, min_step_timeout_s=5.0, connect_timeout_s=2.0)
        model = AutoDistributedModelForCausalLM.from_pretrained(
            box_model, initial_peers=[t.to_drift() for t in left], client_config=config
        )
        try:
            assert torch.equal(model.generate(ids, max_new_tokens=12, do_sample=False), ref)
        finally:
            model.close()


def wait_covered_by(printed: str, want: set[str], timeout: float = 300) -> None:
    """Until every machine in `want` serves a span (the next joiner then sees them all)."""
    token, deadline = parse_join_token(printed), time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if want <= {r.peer_id for r in servers(token)}:
                return
        except Exception:  # a node still starting
            pass
        time.sleep(0.5)
    raise AssertionError(f"not all of {want} serving after {timeout}s")
