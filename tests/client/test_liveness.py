"""Issue 16, finding 10: a frozen server is left within a few step times, not after a fixed
60 s, and generation continues with identical tokens on a replica."""

from __future__ import annotations

import asyncio
import threading
import time

import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.server.chunks import chunk_tokens_for
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
    token it computes (its span's layers and its batched steps alike), and its measured
    pace says so, and its units of work are sized to it (what a server this slow would have
    measured and sized at its start: sized to the fast pace, a unit ran 8x longer than the
    pace says once prompts resized it, and /compute called it frozen)."""
    backend.pace = backend.n_blocks / per_token_s
    backend.chunk_tokens = chunk_tokens_for(backend.pace, backend.n_blocks)

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


def prompts_while_decoding(decoder, prompter, prompts, ids):
    """`decoder` generates 16 tokens after `ids`; after its 4th, `prompter` sends every one of
    `prompts` at once (2 new tokens each, in threads). Returns (decoder's output, the
    prompts' outputs)."""
    go = threading.Event()
    prompted: list[torch.Tensor | None] = [None] * len(prompts)

    def prompt(i: int) -> None:
        go.wait(60)
        prompted[i] = prompter.generate(prompts[i], max_new_tokens=2, do_sample=False)

    def let_the_prompts_in() -> None:
        go.set()
        time.sleep(0.3)  # they reach the server before the decoder's next step

    threads = [threading.Thread(target=prompt, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    try:
        at_4 = LogitsProcessorList([AtStep(4, let_the_prompts_in)])
        out = decoder.generate(ids, max_new_tokens=16, do_sample=False, logits_processor=at_4)
    finally:
        go.set()
        for t in threads:
            t.join(60)
    return out, prompted


def busy_case(model_dir, seed: int):
    """4 random 200-token prompts, a short decode prompt, and what local transformers
    makes of them (2 new tokens each; 16)."""
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 200, (1, 200), generator=gen) for _ in range(4)]
    ids = torch.tensor([[5, 3, 5, 8, 9, 7]])
    refs = [local.generate(p, max_new_tokens=2, do_sample=False) for p in prompts]
    return prompts, ids, refs, local.generate(ids, max_new_tokens=16, do_sample=False)


def recording_bans(*models) -> list[str]:
    """Every peer any of `models`' clients gives up on, from now on."""
    banned: list[str] = []
    for model in models:
        ban = model.client.bans.ban
        model.client.bans.ban = lambda peer, ban=ban, **kw: banned.append(peer) or ban(peer, **kw)
    return banned


async def test_a_busy_server_is_not_left(tiny_dirs, swarm_model):
    """Found in stop 43: prompts of several sessions of one client queued on a server, and a
    decode step sent behind them waited longer than ten decode steps' time: the client banned
    a server that was only busy with the client's own work. A reply's timeout counts the work
    the client already has in flight on that server."""
    model_dir = tiny_dirs("llama")
    prompts, ids, refs, ref = busy_case(model_dir, seed=0)
    swarm, model = await swarm_model(model_dir, [(0, 4)])
    (server,) = swarm.servers
    slow_down(server.server.backend, per_token_s=0.004)  # 200 tokens: 0.8 s; 4 prompts: 3.2 s
    # the client learns the server's pace: decode steps, and a prompt step
    await asyncio.to_thread(model.generate, prompts[0], max_new_tokens=4, do_sample=False)
    banned = recording_bans(model)
    out, prompted = await asyncio.to_thread(prompts_while_decoding, model, model, prompts, ids)
    assert torch.equal(out, ref)
    assert all(p is not None and torch.equal(p, r) for p, r in zip(prompted, refs, strict=True))
    assert banned == []  # no step gave up on the server, nothing was replayed


async def test_a_server_busy_with_another_clients_prompts_is_not_left(tiny_dirs, swarms,
                                                                      sdk_models):  # fmt: skip
    """Left open in stop 44: a client counts only its own calls in flight on a server. When
    another client's prompts queue there, its decode step waits past its timeout; it asks
    the server (GET /compute) whether the step is there and the compute advances, and waits
    on instead of leaving a healthy server as failed."""
    model_dir = tiny_dirs("llama")
    prompts, ids, refs, ref = busy_case(model_dir, seed=1)
    swarm = await swarms.start(model_dir, [(0, 4)])
    mine = await sdk_models.open(model_dir, swarm.token)
    other = await sdk_models.open(model_dir, swarm.token)  # another process's client
    (server,) = swarm.servers
    slow_down(server.server.backend, per_token_s=0.004)  # 200 tokens: 0.8 s; 4 prompts: 3.2 s
    await asyncio.to_thread(mine.generate, ids, max_new_tokens=4, do_sample=False)  # its pace
    assert mine.client.timeouts.timeout(server.node.peer_id, "step", 1) < 3.2
    banned = recording_bans(mine, other)
    out, prompted = await asyncio.to_thread(prompts_while_decoding, mine, other, prompts, ids)
    assert torch.equal(out, ref)
    assert all(p is not None and torch.equal(p, r) for p, r in zip(prompted, refs, strict=True))
    assert banned == []  # no client gave up on the busy server


async def test_a_forward_behind_another_clients_forwards_is_not_left(tiny_dirs, swarms,
                                                                     sdk_models):  # fmt: skip
    """The same for /forward (training, scoring: no session): the call names itself
    (X-Drift-Call) and, past its timeout, the client asks whether the server is still
    serving it (GET /compute?call=) before leaving the server as failed."""
    model_dir = tiny_dirs("llama")
    prompts, ids, _, _ = busy_case(model_dir, seed=2)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = local(ids).logits
    swarm = await swarms.start(model_dir, [(0, 4)])
    mine = await sdk_models.open(model_dir, swarm.token)
    other = await sdk_models.open(model_dir, swarm.token)  # another process's client
    (server,) = swarm.servers
    slow_down(server.server.backend, per_token_s=0.004)  # 200 tokens: 0.8 s; 4 forwards: 3.2 s
    with torch.no_grad():
        await asyncio.to_thread(mine, ids)  # its pace: 6 tokens, 24 ms
    assert mine.client.timeouts.timeout(server.node.peer_id, "forward", 6) < 3.2
    banned = recording_bans(mine, other)
    go = threading.Event()

    def forward(model, x):
        go.wait(60)
        with torch.no_grad():
            return model(x).logits

    others = [asyncio.to_thread(forward, other, p) for p in prompts]
    behind = asyncio.ensure_future(asyncio.gather(*others))
    await asyncio.sleep(0.2)
    go.set()
    await asyncio.sleep(0.3)  # the others' forwards reach the server first
    got = await asyncio.to_thread(forward, mine, ids)
    await behind
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert banned == []  # no client gave up on the busy server
