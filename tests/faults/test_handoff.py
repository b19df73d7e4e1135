"""Sessions survive a graceful stop: the leaving server hands its KV caches over (issue 28).

A real process swarm over TLS on loopback: a seed, C for blocks [0, 2) and two replicas
A, B for [2, 4) of a tiny llama. A greedy generation with a long prompt; the replica
holding the session is SIGTERMed a few tokens in. With handoff (the default) the tokens
equal plain transformers', the client followed its session (no failover) and the other
replica computed only the new tokens (its drift_tokens_total grows by less than half the
history). With `--drain_timeout 0` (no handoff) the client replays the history as before,
which the same counter shows: the check above can fail.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from tests.client.faults import AtStep
from tests.faults.procs import Member, dht, server, tokens_total, wait_online
from tests.tiny_models import save_tiny

pytestmark = pytest.mark.timeout(600)
IDS = torch.randint(3, 200, (1, 96), generator=torch.Generator().manual_seed(0))
NEW, AT = 10, 4  # new tokens; SIGTERM when generation reaches step AT
HISTORY = IDS.shape[1] + AT - 1  # tokens the span holds when the server leaves
DRAINED = re.compile(r"drained: ")  # the leaving server dealt with its sessions
LEFT = re.compile(r"left the swarm")  # ... or, with no drain, left
CONFIG = ClientConfig(swarm_refresh_s=0.2, ban_base_s=0.3, ban_max_s=1.0, max_retries=6,
                      min_step_timeout_s=2.0, connect_timeout_s=3.0)  # fmt: skip


@dataclass
class Swarm:
    model_dir: Path
    seed: Member
    c: Member
    a: Member
    b: Member

    def by_peer(self, peer_id: str) -> Member:
        return next(m for m in (self.a, self.b) if m.peer_id == peer_id)

    def other(self, m: Member) -> Member:
        return self.b if m is self.a else self.a


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    work = tmp_path_factory.mktemp("handoff")
    model_dir = save_tiny("llama", work / "tiny-llama")
    seed = dht("seed", work).start()
    members = [server(n, work, model_dir, s, e, seed)
               for n, s, e in (("c", 0, 2), ("a", 2, 4), ("b", 2, 4))]  # fmt: skip
    try:
        for m in members:
            m.launch()
        for m in members:
            m.wait_started()
        wait_online(seed.token, {m.peer_id for m in members})  # type: ignore[arg-type]
        for m in members:  # each server knows the others (a replacement is in its table)
            wait_online(m.token, {x.peer_id for x in members})  # type: ignore[arg-type]
        yield Swarm(model_dir, seed, *members)
    finally:
        for m in [seed, *members]:
            m.kill()


@pytest.fixture(scope="module")
def reference(swarm: Swarm) -> torch.Tensor:
    local = AutoModelForCausalLM.from_pretrained(swarm.model_dir, dtype=torch.float32).eval()
    return local.generate(IDS, max_new_tokens=NEW, do_sample=False)


def run_with_sigterm(
    swarm: Swarm, until: re.Pattern[str] = DRAINED
) -> tuple[torch.Tensor, object, Member, int, int]:
    """Generate, SIGTERMing the replica in use at step AT; (tokens, session, victim, the
    other replica's drift_tokens_total before the SIGTERM and after the generation)."""
    model = AutoDistributedModelForCausalLM.from_pretrained(
        swarm.model_dir, initial_peers=str(swarm.seed.token), client_config=CONFIG
    )
    seen: dict[str, object] = {}

    def sigterm_in_use() -> None:
        session = model._owned[0].session
        peer = next(s.hop.peer_id for s in session.spans if s.hop.start_block == 2)
        victim = swarm.by_peer(peer)
        seen.update(session=session, victim=victim, before=tokens_total(swarm.other(victim)))
        assert victim.proc is not None
        victim.proc.popen.send_signal(signal.SIGTERM)
        # the next step comes once the leaving server has dealt with the session (else a
        # tiny model's generation may end before its drain begins)
        victim.proc.wait_for(until, timeout=60)

    try:
        out = model.generate(IDS, max_new_tokens=NEW, do_sample=False,
                             logits_processor=LogitsProcessorList([AtStep(AT, sigterm_in_use)]))  # fmt: skip
    finally:
        model.close()
    victim = seen["victim"]
    assert isinstance(victim, Member) and isinstance(seen["before"], int)
    after = tokens_total(swarm.other(victim))
    assert victim.proc is not None
    victim.proc.popen.wait(timeout=60)  # it left (after its drain)
    return out, seen["session"], victim, seen["before"], after


def restart(swarm: Swarm, victim: Member, *extra: str) -> None:
    args = list(victim.args)
    if "--drain_timeout" in args:
        i = args.index("--drain_timeout")
        del args[i : i + 2]
    victim.args = [*args, *extra]
    victim.kill()
    victim.start()
    wait_online(swarm.seed.token, {swarm.a.peer_id, swarm.b.peer_id}, since=victim.launched_at)


def test_sigterm_hands_the_session_over_without_replay(swarm, reference):
    out, session, victim, before, after = run_with_sigterm(swarm)
    assert torch.equal(out, reference)
    assert session.moves == 1 and session.failovers == 0  # followed, not failed over
    grew = after - before
    assert 0 < grew < HISTORY / 2, (grew, HISTORY)  # only the new tokens ran on the other
    restart(swarm, victim)


def test_without_handoff_the_client_replays(swarm, reference):
    """Both replicas with --drain_timeout 0: the leaving one hands nothing over."""
    for m in (swarm.a, swarm.b):
        restart(swarm, m, "--drain_timeout", "0")
    out, session, victim, before, after = run_with_sigterm(swarm, LEFT)
    assert torch.equal(out, reference)
    assert session.moves == 0 and session.failovers >= 1
    assert after - before >= HISTORY  # the history was replayed into the other replica
    restart(swarm, victim)
