"""Gemma 4 through real servers on loopback with the SDK, against local transformers.

Each swarm holds exactly the spans of one split (tests/models/gemma4_helpers.CUTS), so the
client must carry per-layer inputs to every span and the shared K/V across each cut: dense,
MoE, Unified and the multimodal checkpoint, at every split. A server dying mid-generation is
replaced, also by a different split.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from drift.client import ClientConfig
from tests.client.faults import AtStep
from tests.models.gemma4_helpers import CUTS, NUM_BLOCKS
from tests.tiny_models import GEMMA4_FAMILIES

CASES = [(family, cuts) for family in GEMMA4_FAMILIES for cuts in CUTS]
GREEDY = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)


def _ids(batch: int, tokens: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 249, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _spans(cuts: tuple[int, ...]) -> list[tuple[int, int]]:
    bounds = [0, *cuts, NUM_BLOCKS]
    return list(zip(bounds, bounds[1:], strict=False))


def _check(model, local) -> None:
    ids = _ids(2, 11, seed=0)
    with torch.no_grad():
        assert (model(ids).logits - local(ids).logits).abs().max() < 1e-5
    one = ids[:1]
    assert torch.equal(model.generate(one, **GREEDY), local.generate(one, **GREEDY))
    beams = dict(max_new_tokens=6, min_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(one, **beams), local.generate(one, **beams))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a padded batch
    padded = dict(GREEDY, max_new_tokens=8, min_new_tokens=8, attention_mask=mask)
    assert torch.equal(model.generate(ids, **padded), local.generate(ids, **padded))
    # backward: d(loss)/d(inputs_embeds) through hidden states, per-layer inputs, shared K/V
    embeds = model.head.embed(ids)
    mine = embeds.detach().requires_grad_(True)
    model(inputs_embeds=mine, labels=ids).loss.backward()
    ref = embeds.detach().requires_grad_(True)
    local(inputs_embeds=ref, labels=ids).loss.backward()
    assert mine.grad is not None and ref.grad is not None
    assert (mine.grad - ref.grad).abs().max() < 1e-4


@pytest.mark.parametrize(("family", "cuts"), CASES)
async def test_gemma4_through_the_swarm(tiny_dirs, swarm_model, family, cuts):
    model_dir = tiny_dirs(family)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    _, model = await swarm_model(model_dir, _spans(cuts))
    assert model.config.model_type.startswith("gemma4")
    await asyncio.to_thread(_check, model, local)


async def test_failover_mid_generation_lands_on_replacements(tiny_dirs, swarm_model):
    """[0,3) + [3,6) serve first; [3,6) dies: its history (with the K/V of donor 2 it read)
    is replayed into [3,5) + [5,6), where donor 3's K/V now cross a cut. Then the donor span
    [0,3) dies and its twin takes over."""
    model_dir = tiny_dirs("gemma4_text")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = _ids(1, 7, seed=3)
    ref = local.generate(ids, **GREEDY)
    swarm, model = await swarm_model(model_dir, [(0, 3), (3, 6), (3, 5), (5, 6), (0, 3)])
    loop = asyncio.get_running_loop()
    routes: list[list[tuple[int, int]]] = []

    def kill(index: int):
        def run():
            session = model._owned[0].session
            routes.append([(s.hop.start_block, s.hop.end_block) for s in session.spans])
            victim = swarm.by_peer(session.spans[index].hop.peer_id)
            asyncio.run_coroutine_threadsafe(swarm.stop(victim), loop).result()

        return run

    for index in (-1, 0):
        out = await asyncio.to_thread(
            model.generate, ids, **GREEDY,
            logits_processor=LogitsProcessorList([AtStep(10, kill(index))]),
        )  # fmt: skip
        assert torch.equal(out, ref)
        session_routes = routes[-1]
        assert session_routes[0] == (0, 3), session_routes
    assert routes[0] == [(0, 3), (3, 6)]  # the first kill hit [3, 6)
    assert routes[1] == [(0, 3), (3, 5), (5, 6)]  # the second run had only the 3-way split
    assert len(swarm.stopped) == 2


async def test_backward_reroutes_a_dead_hop_over_a_split_that_cuts_the_sharing(
    tiny_dirs, swarm_model
):
    """The forward ran on [0,6); before the backward it dies and only [0,3) + [3,6) are
    left: the hop is redone over them (donor 2's K/V crossing) and the gradients stay exact.
    A slice that would need K/V of blocks it does not run is refused."""
    model_dir = tiny_dirs("gemma4_text")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = _ids(2, 9, seed=4)
    swarm, model = await swarm_model(model_dir, [(0, 6)],
                                     client_config=ClientConfig(swarm_refresh_s=0.1))  # fmt: skip
    embeds = model.head.embed(ids)
    mine = embeds.detach().requires_grad_(True)
    loss = await asyncio.to_thread(lambda: model(inputs_embeds=mine, labels=ids).loss)
    for start, end in ((0, 3), (3, 6)):
        await swarm.add_server(start, end)
    # the client learns the new peers from the seed, then the seed ([0, 6)) dies
    await asyncio.to_thread(model.client.run, model.client.swarm.refresh(force=True))
    dead = swarm.servers[0].node.peer_id
    await swarm.stop(swarm.servers[0])
    await asyncio.sleep(0.2)  # past swarm_refresh_s
    await asyncio.to_thread(loss.backward)
    assert model.client.bans.is_banned(dead)  # the backward met it, then rerouted
    with pytest.raises(ValueError, match="read the keys/values of block 2"):
        model.model.layers[4:](embeds.detach())
    ref = embeds.detach().requires_grad_(True)
    local(inputs_embeds=ref, labels=ids).loss.backward()
    assert mine.grad is not None and ref.grad is not None
    assert (mine.grad - ref.grad).abs().max() < 1e-4
