"""SIGKILL of the middle server of a pushed chain mid-generation (drift.wire.push): real
`drift` processes over TLS on loopback, blocks [0, 1) -> [1, 3) (two replicas) -> [3, 4) of a
tiny llama. The client was pushing when the server died; the tokens equal plain
transformers' greedy ones (the client relays, replays into the replica, and pushes again)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from tests.client.faults import AtStep
from tests.faults.procs import Member, dht, server, wait_online
from tests.tiny_models import save_tiny

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
NEW = 12
CONFIG = ClientConfig(swarm_refresh_s=0.2, ban_base_s=0.3, ban_max_s=1.0, max_retries=6,
                      min_step_timeout_s=1.0, connect_timeout_s=2.0)  # fmt: skip


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Member, list[Member]]]:
    work = tmp_path_factory.mktemp("push-faults")
    model_dir = save_tiny("llama", work / "tiny-llama")
    seed = dht("seed", work).start()
    servers = [server("first", work, model_dir, 0, 1, seed),
               server("mid-a", work, model_dir, 1, 3, seed),
               server("mid-b", work, model_dir, 1, 3, seed),
               server("last", work, model_dir, 3, 4, seed)]  # fmt: skip
    try:
        for m in servers:
            m.launch()
        for m in servers:
            m.wait_started()
        ids = {m.peer_id for m in servers}
        for m in servers:  # every server must list the others to push to them
            assert m.token is not None
            wait_online(m.token, ids - {m.peer_id})
        yield seed, servers
    finally:
        for m in [seed, *servers]:
            m.kill()


def test_sigkill_of_the_middle_server_while_pushing(members):
    seed, servers = members
    model_dir = servers[0].workdir.parent / "tiny-llama"
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reference = local.generate(IDS, max_new_tokens=NEW, do_sample=False)
    model = AutoDistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=str(seed.token), client_config=CONFIG
    )
    seen: dict[str, Any] = {}

    def kill_the_middle() -> None:
        session = model._owned[0].session
        seen["session"], seen["pushed_before"] = session, session.pushed
        middle = next(s.hop.peer_id for s in session.spans if s.hop.start_block == 1)
        next(m for m in servers if m.peer_id == middle).kill()

    try:
        procs = LogitsProcessorList([AtStep(6, kill_the_middle)])
        out = model.generate(IDS, max_new_tokens=NEW, do_sample=False, logits_processor=procs)
        session = seen["session"]
        assert torch.equal(out, reference)
        assert seen["pushed_before"] > 0  # the chain was pushing when the server died
        assert session.failovers >= 1
        assert session.pushed > seen["pushed_before"]  # and pushed again after the failover
    finally:
        model.close()
