"""Handoff (issue 28) in every step mode a session can be in: relayed, pushed server to
server, with a LoRA adapter the servers hold, and Gemma 4's shared K/V across a cut.

Real in-process servers on loopback: a span served twice; a greedy generation drains
(`drift.server.handoff.drain`, what SIGTERM runs) the replica holding the session a few
tokens in. The tokens equal local transformers' (peft for the adapter), the client followed
its session (one move, no failover) and the other replica computed only the new tokens (its
drift_tokens_total grows by less than the history: a replay would be the whole history).
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import ClientConfig
from drift.server.handoff import drain, hand_over_all
from tests.client.faults import AtStep
from tests.server.harness import tokens_total

NEW, AT = 8, 4  # new tokens; the drain when generation reaches step AT
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


async def _knows_each_other(servers, timeout_s: float = 10.0) -> None:
    """Until every server's own table lists every other as a live server (a replacement
    must be in the leaving server's table)."""
    want = {s.node.peer_id for s in servers}
    deadline = time.monotonic() + timeout_s
    while True:
        if all(want - {s.node.peer_id} <= {r.peer_id for r in s.node.live_records()
                                            if r.end_block is not None} for s in servers):  # fmt: skip
            return
        assert time.monotonic() < deadline, "servers do not know each other"
        await asyncio.sleep(0.05)


async def _drain(victim) -> None:
    await drain(victim.server, victim.node, 20.0)


async def _drained_generation(swarm, model, ids, start_block: int, leave=_drain, **generate_kw):
    """Greedy generate(), at step AT `leave` (drain: what SIGTERM runs) the server holding the
    span that begins at `start_block`; (tokens, session, tokens the other replica computed
    meanwhile)."""
    loop = asyncio.get_running_loop()
    await _knows_each_other(swarm.servers)
    seen: dict = {}

    def drain_holder() -> None:
        session = model._owned[0].session
        peer = next(s.hop.peer_id for s in session.spans if s.hop.start_block == start_block)
        victim = swarm.by_peer(peer)
        twin = next(s for s in swarm.servers if s is not victim
                    and s.server.backend.start_block == start_block)  # fmt: skip
        before = asyncio.run_coroutine_threadsafe(tokens_total(twin.url), loop).result(30)
        seen.update(session=session, twin=twin, before=before)
        asyncio.run_coroutine_threadsafe(leave(victim), loop).result(60)

    out = await asyncio.to_thread(
        model.generate, ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
        logits_processor=LogitsProcessorList([AtStep(AT, drain_holder)]), **generate_kw,
    )  # fmt: skip
    grew = await tokens_total(seen["twin"].url) - seen["before"]
    return out, seen["session"], grew


def _check(out, ref, session, grew, history: int) -> None:
    assert torch.equal(out, ref)
    assert session.moves == 1 and session.failovers == 0, (session.moves, session.failovers)
    assert 0 < grew < history, (grew, history)


@pytest.mark.parametrize("push", [True, False], ids=["push", "relay"])
async def test_handoff_relayed_and_pushed(tiny_dirs, swarms, sdk_models, push):
    model_dir = tiny_dirs("llama")
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(1))
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token, client_config=ClientConfig(push=push))
    out, session, grew = await _drained_generation(swarm, model, ids, 2)
    _check(out, ref, session, grew, ids.shape[1] + AT - 1)


async def test_handoff_keeps_the_served_lora_adapter(tiny_dirs, tmp_path: Path, swarms,
                                                     sdk_models):  # fmt: skip
    model_dir = tiny_dirs("llama")
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
    peft_model = get_peft_model(base, config).eval()
    peft_model.save_pretrained(tmp_path / "styled")
    ids = torch.randint(3, 200, (1, 30), generator=torch.Generator().manual_seed(2))
    ref = peft_model.generate(input_ids=ids, max_new_tokens=NEW, min_new_tokens=NEW,
                              do_sample=False)  # fmt: skip
    with peft_model.disable_adapter():
        plain = peft_model.generate(input_ids=ids, max_new_tokens=NEW, min_new_tokens=NEW,
                                    do_sample=False)  # fmt: skip
    assert not torch.equal(ref, plain), "the adapter must change the tokens for this to test it"
    adapters = (("styled", str(tmp_path / "styled")),)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4), (2, 4)], adapters=adapters)
    model = await sdk_models.open(model_dir, swarm.token, active_adapter="styled")
    out, session, grew = await _drained_generation(swarm, model, ids, 2)
    _check(out, ref, session, grew, ids.shape[1] + AT - 1)


async def test_handoff_carries_gemma4_shared_kv(tiny_dirs, swarms, sdk_models):
    """Gemma 4: blocks 4 and 5 read the K/V of donors 3 and 2; the drained span [3, 6)
    holds what it read of donor 2 across the cut, which must move with it."""
    model_dir = tiny_dirs("gemma4_text")
    ids = torch.randint(3, 249, (1, 12), generator=torch.Generator().manual_seed(3))
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    greedy = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    ref = local.generate(ids, **greedy)
    swarm = await swarms.start(model_dir, [(0, 3), (3, 6), (3, 6)])
    model = await sdk_models.open(model_dir, swarm.token)
    out, session, grew = await _drained_generation(swarm, model, ids, 3, pad_token_id=0)
    _check(out, ref, session, grew, ids.shape[1] + AT - 1)


@pytest.mark.parametrize("make_room", [False, True], ids=["beside", "make_room"])
async def test_a_span_move_hands_its_sessions_over(tiny_dirs, swarms, sdk_models, make_room):
    """The balancer's move (BlockServer.move_to handing sessions over first): the holder of
    [2, 4) moves to [0, 2) mid-generation; its session goes to the other [2, 4) server with
    its cache, instead of keeping the move waiting or being replayed. `make_room` (a full
    machine): the same, with the old span freed before the new one loads."""
    model_dir = tiny_dirs("llama")
    ids = torch.randint(3, 200, (1, 40), generator=torch.Generator().manual_seed(4))
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ref = local.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token)

    async def move(victim) -> None:
        hand_over = functools.partial(hand_over_all, victim.server, victim.node)
        await victim.server.move_to(0, 2, drain_timeout_s=20, before_drain=hand_over,
                                    make_room=make_room)  # fmt: skip
        assert (victim.server.backend.start_block, victim.server.backend.end_block) == (0, 2)

    out, session, grew = await _drained_generation(swarm, model, ids, 2, leave=move)
    _check(out, ref, session, grew, ids.shape[1] + AT - 1)
