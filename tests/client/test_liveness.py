"""Issue 16, finding 10: a frozen server is left within a few step times, not after a fixed
60 s, and generation continues with identical tokens on a replica."""

from __future__ import annotations

import asyncio
import threading

import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from tests.client.faults import AtStep


def freeze(backend, released: threading.Event) -> threading.Event:
    """Make `backend`'s compute hang (as under SIGSTOP) once the returned event is set: its
    span's layers (eager steps) and its batched steps (the lean decode unit, where on)."""
    frozen = threading.Event()

    def hanging(run):
        def maybe_hang(*args, **kwargs):
            if frozen.is_set():
                released.wait(120)
            return run(*args, **kwargs)

        return maybe_hang

    backend.span.run_layers = hanging(backend.span.run_layers)
    backend.run_steps = hanging(backend.run_steps)
    return frozen


async def test_frozen_server_is_left_within_a_few_step_times(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 3, 5, 8, 9, 7]])
    ref = local.generate(ids, max_new_tokens=24, do_sample=False)
    swarm, model = await swarm_model(model_dir, [(0, 4), (0, 4)])
    released = threading.Event()
    frozen = {s.node.peer_id: freeze(s.server.backend, released) for s in swarm.servers}
    stalled: list[str] = []

    def freeze_the_one_in_use():
        session = model._owned[0].session
        (span,) = session.spans
        frozen[span.hop.peer_id].set()
        stalled.append(span.hop.peer_id)

    try:
        out = await asyncio.to_thread(
            model.generate, ids, max_new_tokens=24, do_sample=False,
            logits_processor=LogitsProcessorList([AtStep(12, freeze_the_one_in_use)]),
        )  # fmt: skip
    finally:
        released.set()
    assert torch.equal(out, ref)  # the replica took over with identical tokens
    (peer,) = stalled
    assert model.client.bans.is_banned(peer)  # the client gave up on the frozen server
    # ...after a wait set by that server's measured pace, not the fixed step_timeout_s
    waited = model.client.timeouts.timeout(f"{peer}:step", 1)
    assert waited < model.client.config.step_timeout_s / 4, waited
