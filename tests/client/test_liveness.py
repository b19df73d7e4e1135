"""Issue 16, finding 10: a frozen server is left within a few step times, not after a fixed
60 s, and generation continues with identical tokens on a replica."""

from __future__ import annotations

import asyncio
import threading
import time

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
    waited = model.client.timeouts.timeout(peer, "step", 1)
    assert waited < model.client.config.step_timeout_s / 4, waited


def slow_down(backend, per_token_s: float) -> None:
    """Make `backend` a slow but healthy server: every forward sleeps `per_token_s` per
    token it computes (its span's layers and its batched steps alike)."""

    def paced(run, tokens):
        def slow(*args, **kwargs):
            time.sleep(per_token_s * tokens(*args, **kwargs))
            return run(*args, **kwargs)

        return slow

    backend.span.run_layers = paced(
        backend.span.run_layers, lambda _ids, hidden, *a, **k: hidden.shape[0] * hidden.shape[1]
    )
    backend.run_steps = paced(
        backend.run_steps, lambda steps: sum(s.hidden.shape[0] * s.hidden.shape[1] for s in steps)
    )


async def test_a_busy_server_is_not_left(tiny_dirs, swarm_model):
    """Found in stop 43: prompts of several sessions of one client queued on a server, and a
    decode step sent behind them waited longer than ten decode steps' time: the client banned
    a server that was only busy with the client's own work. A reply's timeout counts the work
    the client already has in flight on that server."""
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (1, 200), generator=gen) for _ in range(4)]
    ids = torch.tensor([[5, 3, 5, 8, 9, 7]])
    ref = local.generate(ids, max_new_tokens=16, do_sample=False)
    refs = [local.generate(p, max_new_tokens=2, do_sample=False) for p in prompts]
    swarm, model = await swarm_model(model_dir, [(0, 4)])
    (server,) = swarm.servers
    slow_down(server.server.backend, per_token_s=0.004)  # 200 tokens: 0.8 s; 4 prompts: 3.2 s
    # the client learns the server's pace: decode steps, and a prompt step
    await asyncio.to_thread(model.generate, prompts[0], max_new_tokens=4, do_sample=False)
    banned: list[str] = []
    ban = model.client.bans.ban
    model.client.bans.ban = lambda peer, **kw: banned.append(peer) or ban(peer, **kw)
    go = threading.Event()
    prompted: list[torch.Tensor | None] = [None] * len(prompts)

    def prompt(i: int) -> None:
        go.wait(60)
        prompted[i] = model.generate(prompts[i], max_new_tokens=2, do_sample=False)

    def let_the_prompts_in() -> None:
        go.set()
        time.sleep(0.3)  # they reach the server before this session's next decode step

    threads = [threading.Thread(target=prompt, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    try:
        out = await asyncio.to_thread(
            model.generate, ids, max_new_tokens=16, do_sample=False,
            logits_processor=LogitsProcessorList([AtStep(4, let_the_prompts_in)]),
        )  # fmt: skip
    finally:
        go.set()
        for t in threads:
            await asyncio.to_thread(t.join, 60)
    assert torch.equal(out, ref)
    assert all(p is not None and torch.equal(p, r) for p, r in zip(prompted, refs, strict=True))
    assert banned == []  # no step gave up on the server, nothing was replayed
