"""LoRA weights at a block server: applied in /forward, /backward and sessions (the same
numbers each way), and bad ones refused with a clear 4xx while the node keeps serving."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
import torch

from drift.wire import messages as m
from drift.wire.frames import MEDIA_TYPE
from drift.wire.lora import lora_name
from tests.server.posts import post
from tests.server.wsclient import RawSession

H = 64


def _lora(blocks=(0, 1), module="self_attn.q_proj", r=2, out=H, seed=0):
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for b in blocks:
        weights[lora_name(b, module, "A")] = torch.randn(r, H, generator=gen) * 0.3
        weights[lora_name(b, module, "B")] = torch.randn(out, r, generator=gen) * 0.3
    return weights


@pytest.fixture
async def env(servers, tiny_llama):
    running = await servers(tiny_llama, 0, 2)
    async with aiohttp.ClientSession() as http:
        yield running, http, running.server.backend.fingerprint


async def _error(http, url, message):
    body = m.encode(message)
    async with http.post(url, data=body, headers={"Content-Type": MEDIA_TYPE}) as resp:
        return resp.status, (await resp.json(content_type=None))["error"]


async def test_lora_weights_change_forward_and_come_back_as_gradients(env):
    running, http, fp = env
    hidden = torch.randn(1, 5, H)
    lora = _lora()
    plain = await post(http, f"{running.url}/forward", m.ForwardRequest(fp, 0, 2, hidden),
                       m.ForwardResponse)  # fmt: skip
    adapted = await post(http, f"{running.url}/forward",
                         m.ForwardRequest(fp, 0, 2, hidden, extras=lora), m.ForwardResponse)  # fmt: skip
    assert (adapted.hidden_states - plain.hidden_states).abs().max() > 1e-3
    # the same step in a session (weights sent once, with its first step) gives the same
    sess = await RawSession.open(http, running.url, fp, 0, 2, max_length=8)
    first = await sess.step(hidden[:, :3], 0, extras=lora)
    second = await sess.step(hidden[:, 3:], 3)  # no weights sent: the session kept them
    await sess.ws.close()
    stepped = torch.cat([first, second], dim=1)
    assert (stepped - adapted.hidden_states).abs().max() < 1e-5
    grad = torch.randn(1, 5, H)
    body = m.encode(m.BackwardRequest(fp, 0, 2, hidden, grad, extras=lora))
    async with http.post(f"{running.url}/backward", data=body,
                         headers={"Content-Type": MEDIA_TYPE}) as resp:  # fmt: skip
        reply = m.decode(m.BackwardResponse, await resp.read(), extras=tuple(lora))
    assert set(reply.grad_extras) == set(lora)
    # autograd through the span itself, with the weights as leaves
    span = running.server.backend.span
    leaves = {k: v.clone().requires_grad_(True) for k, v in lora.items()}
    with torch.enable_grad():
        inputs = hidden.clone().requires_grad_(True)
        out, _ = span.run_layers((0, 1), inputs, torch.ones(1, 5, dtype=torch.bool), None, None,
                                 0, leaves)  # fmt: skip
        out.backward(grad)
    for name, leaf in leaves.items():
        assert (reply.grad_extras[name] - leaf.grad).abs().max() < 1e-5, name
    assert (reply.grad_inputs - inputs.grad).abs().max() < 1e-5


async def test_bad_lora_is_refused(env):
    running, http, fp = env
    url, hidden = f"{running.url}/forward", torch.randn(1, 2, H)
    cases = [
        ({**_lora(), lora_name(0, "self_attn.q_proj", "B"): torch.zeros(H + 1, 2)},
         "expected [64, 2]"),
        (_lora(blocks=(3,)), "block 3 has no LoRA-adaptable module"),
        (_lora(module="self_attn.nope"), "no LoRA-adaptable module 'self_attn.nope'"),
        ({lora_name(0, "self_attn.q_proj", "A"): torch.zeros(2, H)}, "comes without"),
        ({**_lora(), lora_name(0, "self_attn.q_proj", "A"): torch.full((2, H), float("nan"))},
         "not all finite"),
        ({"lora.x.y": torch.zeros(2, H)}, "not a LoRA weight name"),
    ]  # fmt: skip
    for extras, words in cases:
        status, err = await _error(http, url, m.ForwardRequest(fp, 0, 2, hidden, extras=extras))
        assert status == 400 and err["code"] == "bad_tensor" and words in err["message"], err
    status, err = await _error(http, url, m.ForwardRequest(fp, 0, 2, hidden, adapter="nope"))
    assert status == 404 and err["code"] == "unknown_adapter" and "'nope'" in err["message"]
    status, err = await _error(http, url, m.ForwardRequest(fp, 0, 2, hidden, adapter="a:b"))
    assert status == 400 and "without ':'" in err["message"]
    body = {"start_block": 0, "end_block": 2, "hidden_states": hidden.tolist(), "adapter": "nope"}
    async with http.post(url, json=body) as resp:  # the plain-JSON form takes it too
        err = (await resp.json())["error"]
        assert resp.status == 404 and err["code"] == "unknown_adapter"
    ws = await http.ws_connect(f"{running.url}/inference")
    await ws.send_str(orjson.dumps(m.OpenSession(fp, 0, 2, 8, 1, "float32", "nope").to_wire())
                      .decode())  # fmt: skip
    reply = orjson.loads((await ws.receive()).data)
    await ws.close()
    assert reply["type"] == "error" and reply["code"] == "unknown_adapter"
    ok = await post(http, url, m.ForwardRequest(fp, 0, 2, hidden), m.ForwardResponse)
    assert ok.hidden_states.shape == hidden.shape  # the node keeps serving


async def test_a_moved_server_reads_its_adapters_for_the_new_blocks(servers, tiny_llama,
                                                                      tmp_path):  # fmt: skip
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    local = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    config = LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    get_peft_model(local, config).save_pretrained(tmp_path / "ad")
    running = await servers(tiny_llama, 0, 2, adapters=(("ad", str(tmp_path / "ad")),))
    assert {int(n.split(".")[1]) for n in running.server.backend.span.adapters["ad"]} == {0, 1}
    await running.server.move_to(2, 4, drain_timeout_s=5)
    span = running.server.backend.span
    assert (span.start_block, span.end_block) == (2, 4)
    assert {int(n.split(".")[1]) for n in span.adapters["ad"]} == {2, 3}
    assert running.server.describe().adapters == ["ad"]
