"""Issue 28's case on real weights: a 1,500-token SmolLM2 session survives its server's SIGTERM.

Real processes over TLS on loopback: a seed, A and B both serving blocks [0, 15) of SmolLM2
(float32) and C serving [15, 30). A greedy generation with a 1,500-token prompt; after 5 new
tokens the replica holding the session's first span is SIGTERMed, and generation goes on at
once (the test does not wait for the drain). Tokens equal plain transformers'; the other
replica computes only the new tokens (its drift_tokens_total grows by less than half the
history: a replay would be 1,500+); the worst step after the SIGTERM is at most 5x the median
step before it. With server-to-server push (the default) and with the client relaying.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from drift.models.checkpoint import open_checkpoint
from tests.faults.procs import Member, dht, server, tokens_total, wait_online

# The long form of tests/faults/test_handoff.py (which runs in CI): opt in with
# DRIFT_HANDOFF_E2E=1. It passes alone (worst step 225-252 ms against a median of 80-85 ms)
# but its 5x step bound failed inside a full run of the suite on a 2-core machine (364 ms
# against 5 x 63 ms): a timing bound for a quiet machine.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("DRIFT_HANDOFF_E2E") != "1",
        reason="the long handoff run: set DRIFT_HANDOFF_E2E=1",
    ),
]
PROMPT, NEW, AT = 1500, 15, 6  # SIGTERM when generation reaches step AT: 5 new tokens made
IDS = torch.randint(3, 40_000, (1, PROMPT), generator=torch.Generator().manual_seed(0))


class StepClock(LogitsProcessor):
    """Times each generation step (call to call); runs `action` at call `at`, its own time
    (signalling, reading a counter) not counted in the step after it."""

    def __init__(self, at: int, action) -> None:
        self.at, self.action, self.calls, self.action_s = at, action, 0, 0.0
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        self.calls += 1
        self.stamps.append(time.perf_counter())
        if self.calls == self.at:
            self.action()
            self.action_s = time.perf_counter() - self.stamps[-1]
        return scores

    def split(self) -> tuple[list[float], list[float]]:
        """Seconds of the decode steps before the action (those ending at calls 2..at) and
        after it (ending at calls at+1..)."""
        steps = [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        steps[self.at - 1] -= self.action_s
        return steps[: self.at - 1], steps[self.at - 1 :]


class Cluster:
    def __init__(self, seed: Member, a: Member, b: Member, c: Member, model_dir: Path) -> None:
        self.seed, self.a, self.b, self.c, self.model_dir = seed, a, b, c, model_dir

    def replica(self, peer_id: str) -> Member:
        return next(m for m in (self.a, self.b) if m.peer_id == peer_id)

    def other(self, m: Member) -> Member:
        return self.b if m is self.a else self.a


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, smollm2_cache: Path) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("handoff-smollm2")
    model_dir = open_checkpoint("smollm2", cache_dir=smollm2_cache, dtype=torch.float32).path
    seed = dht("seed", work).start()
    members = [server(n, work, Path(model_dir), s, e, seed)
               for n, s, e in (("a", 0, 15), ("b", 0, 15), ("c", 15, 30))]  # fmt: skip
    try:
        for m in members:
            m.launch()
        for m in members:
            m.wait_started()
        for m in [seed, *members]:  # each knows the others (a replacement is in its table)
            wait_online(m.token, {x.peer_id for x in members}, timeout=120)  # type: ignore[arg-type]
        yield Cluster(seed, *members, model_dir=Path(model_dir))
    finally:
        for m in [seed, *members]:
            m.kill()


@pytest.fixture(scope="module")
def reference(cluster: Cluster) -> torch.Tensor:
    local = AutoModelForCausalLM.from_pretrained(cluster.model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return local.generate(IDS, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)


@pytest.mark.parametrize("push", [True, False], ids=["push", "relay"])
def test_a_1500_token_session_survives_sigterm_without_replay(cluster, reference, push):
    config = ClientConfig(push=push, swarm_refresh_s=0.2, min_step_timeout_s=5.0)
    model = AutoDistributedModelForCausalLM.from_pretrained(
        cluster.model_dir, initial_peers=str(cluster.seed.token), client_config=config
    )
    seen: dict[str, object] = {}

    def sigterm_holder() -> None:
        session = model._owned[0].session
        peer = next(s.hop.peer_id for s in session.spans if s.hop.start_block == 0)
        victim = cluster.replica(peer)
        seen.update(session=session, victim=victim, before=tokens_total(cluster.other(victim)))
        assert victim.proc is not None
        victim.proc.popen.send_signal(signal.SIGTERM)

    clock = StepClock(AT, sigterm_holder)
    try:
        with torch.no_grad():
            out = model.generate(IDS, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                 logits_processor=LogitsProcessorList([clock]))  # fmt: skip
    finally:
        model.close()
    victim, session = seen["victim"], seen["session"]
    assert isinstance(victim, Member) and isinstance(seen["before"], int)
    grew = tokens_total(cluster.other(victim)) - seen["before"]
    assert torch.equal(out, reference)
    assert session.moves == 1 and session.failovers == 0, (session.moves, session.failovers)  # type: ignore[attr-defined]
    assert 0 < grew < (PROMPT + AT) / 2, grew  # the new tokens only, no replay
    before, after = clock.split()
    assert max(after) <= 5 * statistics.median(before), (before, after)
    print(f"push={push}: median step before {statistics.median(before) * 1e3:.0f} ms, worst "
          f"after {max(after) * 1e3:.0f} ms; the other replica computed {grew} tokens")  # fmt: skip
    assert victim.proc is not None
    victim.proc.popen.wait(timeout=60)  # it left, after its drain
    victim.start()  # back, same identity, for the next case
    wait_online(cluster.seed.token, {cluster.a.peer_id, cluster.b.peer_id}, timeout=120)  # type: ignore[arg-type]
    wait_online(cluster.other(victim).token, {victim.peer_id}, timeout=120)  # type: ignore[arg-type]
