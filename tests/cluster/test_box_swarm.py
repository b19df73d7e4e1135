"""Three small machines in a box serve a model none of them can hold, with `drift up` and the
join command it prints only: the blocks they choose cover the model, greedy tokens equal local
transformers, and a machine SIGKILLed mid-generation fails over to the others, same tokens.

Each machine has 0.75 GiB (its own memory cgroup and network namespace): about 7 of the 12
blocks fit, so no machine holds the model but the three hold it with blocks to spare.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from tests.client.faults import AtStep
from tests.cluster.box import Box
from tests.cluster.swarm import covered, start_swarm, wait_covered

# machines as processes in namespaces, a checkpoint with SmolLM2's tokenizer (demo weights)
pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
BLOCKS = 12


def test_three_small_machines_cover_the_model_and_fail_over(box_ok, box_model: Path,
                                                              tmp_path: Path) -> None:  # fmt: skip
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    local = AutoModelForCausalLM.from_pretrained(box_model, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=12, do_sample=False)
    with Box(3, tmp_path, memory=int(0.75 * 2**30)) as box:
        token, started = start_swarm(box.machines, str(box_model), "--device", "cpu")
        spans = wait_covered(token, BLOCKS, {s.peer_id for s in started})
        for s, (start, end) in ((s, spans[s.peer_id]) for s in started):
            assert s.budget_line.startswith("budget ") and "from cgroup v" in s.budget_line
            assert end - start < BLOCKS, f"{s.machine.name} holds the whole model"
        config = ClientConfig(swarm_refresh_s=0.2, ban_base_s=0.3, ban_max_s=1.0,
                              min_step_timeout_s=2.0, connect_timeout_s=2.0)  # fmt: skip
        model = AutoDistributedModelForCausalLM.from_pretrained(
            box_model, initial_peers=str(token), client_config=config
        )
        try:
            assert torch.equal(model.generate(ids, max_new_tokens=12, do_sample=False), ref)
            killed: list[str] = []

            def kill_a_spare_machine_in_use() -> None:
                used = {span.hop.peer_id for span in model._owned[0].session.spans}
                records = [(p, s) for p, s in spans.items()]
                for s in started:
                    rest = [type("R", (), {"span": sp})() for p, sp in records if p != s.peer_id]
                    if s.peer_id in used and covered(rest, BLOCKS):  # type: ignore[arg-type]
                        s.proc.kill()
                        killed.append(s.machine.name)
                        return

            hooks = LogitsProcessorList([AtStep(4, kill_a_spare_machine_in_use)])
            out = model.generate(ids, max_new_tokens=12, do_sample=False, logits_processor=hooks)
            assert killed, f"no machine in the session can go without losing a block: {spans}"
            assert torch.equal(out, ref)
        finally:
            model.close()
        assert all(m.oom_kills() == 0 for m in box.machines)
