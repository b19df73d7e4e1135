"""Failover across real `drift server` processes: SIGKILL the server in use mid-generation."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM
from tests.client.faults import AtStep
from tests.client.procs import ServerProc


@pytest.mark.slow
def test_sigkill_server_in_use_mid_generation(tiny_dirs, tmp_path, drift_procs, sdk_models):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    ref = local.generate(ids, max_new_tokens=40, do_sample=False)

    seed = ServerProc(model_dir, 0, 2, tmp_path / "seed")
    drift_procs.append(seed)
    seed.wait_started()
    twins = [ServerProc(model_dir, 2, 4, tmp_path / f"twin{i}", seed.token) for i in range(2)]
    drift_procs.extend(twins)
    for p in twins:
        p.wait_started()
    seed.wait_members({p.peer_id for p in drift_procs})

    model = AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=seed.token)
    sdk_models.close_later(lambda: model)
    clean = model.generate(ids, max_new_tokens=40, do_sample=False)
    assert torch.equal(clean, ref)
    killed: list[str] = []

    def kill_span_in_use():
        session = model._owned[0].session
        in_use = {span.hop.peer_id for span in session.spans}
        victim = next(p for p in twins if p.peer_id in in_use)
        victim.kill()
        killed.append(victim.peer_id)

    out = model.generate(ids, max_new_tokens=40, do_sample=False,
                         logits_processor=LogitsProcessorList([AtStep(20, kill_span_in_use)]))  # fmt: skip
    assert killed and model.client.bans.is_banned(killed[0])
    assert torch.equal(out, clean)
    assert torch.equal(out, ref)
