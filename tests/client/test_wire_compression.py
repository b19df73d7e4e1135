"""Activation compression on the wire (ClientConfig.wire_dtype) through real loopback servers:
steps (pushed and relayed), /forward and /backward stay close to local transformers within
each form's error, and a server refuses a form it does not know (400 naming it)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch

from drift.client import ClientConfig
from drift.wire import messages as m
from drift.wire.compress import WIRE_DTYPE
from drift.wire.frames import MEDIA_TYPE, encode_frame
from tests.client.push_helpers import IDS, decode, wait_all_know_each_other
from tests.server.reference import load_reference

# max |logit error| bound per form on the tiny llama (float32 model); measured errors on
# SmolLM2 are in README's Performance section (scripts/bench_network.py)
BOUND = {"float16": 2e-3, "bfloat16": 2e-2, "int8": 5e-2}


@pytest.mark.parametrize("form", ["float16", "int8"])
async def test_steps_forward_backward_compressed(tiny_dirs, swarms, sdk_models, form):
    model_dir = tiny_dirs("llama")
    swarm = await swarms.start(model_dir, [(0, 1), (1, 3), (3, 4)])
    await wait_all_know_each_other(swarm)
    local = load_reference(model_dir)
    for push in (True, False):
        model = await sdk_models.open(model_dir, swarm.token,
                                      client_config=ClientConfig(wire_dtype=form, push=push))  # fmt: skip
        ids, logits = await asyncio.to_thread(decode, model)
        with torch.no_grad():
            ref = local(ids[:, :-1]).logits[:, IDS.shape[1] - 1 :]
        assert 0 < (logits - ref).abs().max() < BOUND[form]  # compressed, and close
    assert [len(s.server.links._links) for s in swarm.servers] == [1, 1, 0]

    def train(model) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = model.get_input_embeddings()(IDS).detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds).logits
        logits.square().mean().backward()
        return logits.detach(), embeds.grad

    got, grad = await asyncio.to_thread(train, model)  # /forward and /backward
    ref_logits, ref_grad = train(local)
    assert (got - ref_logits).abs().max() < BOUND[form]
    assert (grad - ref_grad).abs().max() < BOUND[form] * ref_grad.abs().max() * 10


async def test_unknown_wire_form_is_refused(tiny_dirs, servers):
    model_dir = tiny_dirs("llama")
    running = await servers(model_dir, 0, 2)
    backend = running.server.backend
    req = m.ForwardRequest(backend.fingerprint, 0, 2, torch.randn(1, 2, backend.hidden_size))
    params, tensors = req.to_wire()
    params[WIRE_DTYPE] = "int4"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{running.url}/forward", data=encode_frame(params, tensors),
                             headers={"Content-Type": MEDIA_TYPE}) as resp:  # fmt: skip
            assert resp.status == 400
            body = await resp.json()
    assert "int4" in body["error"]["message"] and "wire_dtype" in body["error"]["message"]
