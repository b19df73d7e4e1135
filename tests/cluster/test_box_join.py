"""A fourth machine joins a covered swarm of three small box machines mid-generation, with the
printed join command only: it takes the blocks where the swarm is weakest (the span
drift.swarm.choose_span picks from the records it read), coverage stays full, and the
session running through the join goes on unbroken: no failover, tokens equal local
transformers. A later generation gives the same tokens too.

Each machine has 0.75 GiB (its own memory cgroup and network namespace), about 7 of the 12
blocks of the box model; no machine is OOM-killed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import AutoDistributedModelForCausalLM, ClientConfig
from drift.swarm import choose_span
from drift.swarm.coverage import block_throughputs
from tests.client.faults import AtStep
from tests.cluster.box import Box
from tests.cluster.swarm import JOIN_RE, PEER_RE, servers, start_swarm, wait_covered

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]
BLOCKS = 12
SERVING_RE = re.compile(r"^serving blocks \[(\d+), (\d+)\)")


def test_a_fourth_machine_joins_where_the_swarm_is_weakest_without_breaking_a_session(
    box_ok, box_model: Path, tmp_path: Path
) -> None:
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    local = AutoModelForCausalLM.from_pretrained(box_model, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=12, do_sample=False)
    del local
    with Box(4, tmp_path, memory=int(0.75 * 2**30)) as box:
        token, started = start_swarm(box.machines[:3], str(box_model), "--device", "cpu")
        three = {s.peer_id for s in started}
        printed = JOIN_RE.search("".join(started[0].proc.log)).group(1)  # type: ignore[union-attr]
        wait_covered(token, BLOCKS, three)
        config = ClientConfig(swarm_refresh_s=0.2, min_step_timeout_s=5.0, connect_timeout_s=2.0)
        model = AutoDistributedModelForCausalLM.from_pretrained(
            box_model, initial_peers=str(token), client_config=config
        )
        joined: dict[str, object] = {}

        def join_a_fourth_machine() -> None:
            before = [r for r in servers(token) if r.peer_id in three]
            proc = box.machines[3].up(str(box_model), "--join", printed)  # as printed
            peer = proc.wait_for(PEER_RE, timeout=120).group(1)
            start, end = map(int, proc.wait_for(SERVING_RE, timeout=300).groups())
            spans = wait_covered(token, BLOCKS, three | {peer})
            joined.update(before=before, span=(start, end), spans=spans)

        try:
            hooks = LogitsProcessorList([AtStep(4, join_a_fourth_machine)])
            with model.inference_session(max_length=64) as session:
                out = model.generate(ids, max_new_tokens=12, do_sample=False,
                                     logits_processor=hooks)  # fmt: skip
                assert session.failovers == 0, "the join broke the running session"
            assert torch.equal(out, ref)
            assert torch.equal(model.generate(ids, max_new_tokens=12, do_sample=False), ref)
        finally:
            model.close()

        before, (start, end) = joined["before"], joined["span"]
        assert len(before) == 3, f"not three servers before the join: {before}"
        assert (start, end) == choose_span(before, BLOCKS, end - start)  # type: ignore[arg-type]
        was = block_throughputs(before, BLOCKS)  # type: ignore[arg-type]
        now = block_throughputs(servers(token), BLOCKS)
        weakest = [b for b in range(BLOCKS) if was[b] == min(was)]
        assert any(start <= b < end for b in weakest), f"joined at {start, end}, weakest {weakest}"
        assert min(now) > 0 and sum(now) > sum(was)
        assert all(m.oom_kills() == 0 for m in box.machines)
