"""Failover mid-generation (a server stops; its span is replayed elsewhere) and ptune grads."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList

from tests.client.faults import AtStep


async def test_server_dies_mid_generation(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    ref = local.generate(ids, max_new_tokens=40, do_sample=False)
    loop = asyncio.get_running_loop()
    swarm, model = await swarm_model(model_dir, [(0, 2), (2, 4), (2, 4)])
    killed = []

    def kill():
        session = model._owned[0].session
        hop = session.spans[-1].hop
        victim = swarm.by_peer(hop.peer_id)
        asyncio.run_coroutine_threadsafe(swarm.stop(victim), loop).result()
        killed.append(hop.peer_id)

    out = await asyncio.to_thread(
        model.generate, ids, max_new_tokens=40, do_sample=False,
        logits_processor=LogitsProcessorList([AtStep(20, kill)]),
    )  # fmt: skip
    assert killed and model.client.bans.is_banned(killed[0])
    assert torch.equal(out, ref)


async def test_ptune_prompt_gradients_match_local(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[7, 8, 9, 10, 11, 12]])
    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)], tuning_mode="ptune", pre_seq_len=3)

    def remote_grad():
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.loss.detach(), model.ptune.prompt_embeddings.grad.clone()

    loss, grad = await asyncio.to_thread(remote_grad)
    prefix = model.ptune.prompt_embeddings.detach().clone().requires_grad_(True)
    embeds = torch.cat([prefix.unsqueeze(0), local.model.embed_tokens(ids)], dim=1)
    logits = local(inputs_embeds=embeds).logits[:, 3:]
    ref_loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-4
    assert (grad - prefix.grad).abs().max() < 1e-4
    assert grad.abs().sum() > 0
    assert all(not p.requires_grad for p in model.head.parameters())
