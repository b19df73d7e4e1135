"""LoRA through the swarm: adapters served with --adapters, and LoRA trained by the client,
both compared with plain peft on the local model (same weights, same batch)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from drift.client import ClientConfig
from drift.wire.errors import BadRequest, MissingBlocks

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = torch.tensor([[5, 17, 42, 99, 7, 3], [8, 9, 10, 11, 12, 13]])


def _peft_adapter(model_dir, out_dir, seed=0, targets=TARGETS, r=4):
    """A local peft model with random non-zero LoRA weights, saved to `out_dir`."""
    torch.manual_seed(seed)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(local, config).eval()
    peft_model.save_pretrained(out_dir)
    return peft_model


async def test_served_adapter_matches_local_peft(tiny_dirs, tmp_path, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    ref = _peft_adapter(model_dir, tmp_path / "styled")
    adapters = (("styled", str(tmp_path / "styled")),)
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], adapters=adapters)
    model = await sdk_models.open(model_dir, swarm.token, active_adapter="styled")
    plain = await sdk_models.open(model_dir, swarm.token)
    with torch.no_grad():
        want = ref(IDS).logits
        base = ref.get_base_model()
        with ref.disable_adapter():
            want_plain = base(IDS).logits
    assert (want - want_plain).abs().max() > 1e-2  # the adapter changes the logits

    def remote():
        with torch.no_grad():
            got = model(IDS).logits
            got_plain = plain(IDS).logits
            tokens = model.generate(IDS[:1], max_new_tokens=5, do_sample=False)
            with model.inference_session(max_length=16) as session:
                first = model(IDS[:1, :4]).logits
                second = model(IDS[:1, 4:]).logits
            assert session.adapter == "styled"
            plain.config.active_adapter = "styled"  # Petals' idiom: the config says
            got_petals = plain(IDS).logits
            plain.active_adapter = None
            assert torch.equal(plain(IDS).logits, got_plain)
        return got, got_plain, tokens, torch.cat([first, second], dim=1), got_petals

    got, got_plain, tokens, stepped, got_petals = await asyncio.to_thread(remote)
    assert (got_petals - want).abs().max() < 1e-4
    assert (got - want).abs().max() < 1e-4
    assert (got_plain - want_plain).abs().max() < 1e-4
    assert (stepped - want[:1]).abs().max() < 1e-4
    ref_tokens = ref.generate(input_ids=IDS[:1], max_new_tokens=5, do_sample=False)
    assert torch.equal(tokens, ref_tokens)
    info = swarm.seed.server.describe()
    assert info.adapters == ["styled"]
    assert all(r.adapters == ("styled",) for r in swarm.seed.node.live_records()
               if r.end_block is not None)  # fmt: skip


async def test_routing_needs_the_adapter(tiny_dirs, tmp_path, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    _peft_adapter(model_dir, tmp_path / "half")
    swarm = await swarms.start(model_dir, [(0, 2)], adapters=(("half", str(tmp_path / "half")),))
    await swarm.add_server(2, 4, adapters=())  # blocks 2-3 without the adapter
    model = await sdk_models.open(model_dir, swarm.token, active_adapter="half")

    def remote():
        with torch.no_grad():
            model(IDS)

    with pytest.raises(MissingBlocks, match=r"adapter 'half'.*blocks 2-3"):
        await asyncio.to_thread(remote)


def test_bad_adapters_are_refused(tiny_dirs, tmp_path):
    from drift.models.checkpoint import open_checkpoint
    from drift.models.span import ModelSpan
    from drift.server.adapters import load_adapters
    from drift.server.config import parse_adapters

    model_dir = tiny_dirs("llama")
    _peft_adapter(model_dir, tmp_path / "wide", r=4)
    span = ModelSpan.load(open_checkpoint(str(model_dir)), 0, 2)
    with pytest.raises(BadRequest, match="neither a directory"):
        load_adapters(span, [("x", str(tmp_path / "nowhere"))])
    # another model's adapter: the same module names, other sizes
    other = tmp_path / "other"
    _peft_adapter(model_dir, other, r=4)
    from safetensors.torch import load_file, save_file

    tensors = load_file(other / "adapter_model.safetensors")
    key = next(k for k in tensors if "q_proj.lora_A" in k)
    tensors[key] = torch.zeros(4, 32)
    save_file(tensors, other / "adapter_model.safetensors")
    with pytest.raises(BadRequest, match="hidden size 32"):
        load_adapters(span, [("other", str(other))])
    assert parse_adapters(["a=/x/y", "/p/q/styled/"]) == (("a", "/x/y"), ("styled", "/p/q/styled/"))
    with pytest.raises(ValueError, match="distinct"):
        parse_adapters(["/a/same", "/b/same"])
    with pytest.raises(ValueError, match="without ':'"):
        parse_adapters(["a:b=/x"])
    assert span.adapters == {}
    load_adapters(span, [("wide", str(tmp_path / "wide"))])
    assert set(span.adapters) == {"wide"}
    assert isinstance(PeftModel, type)


def _copy_from_peft(model, ref):
    """The client's LoRA weights set to the local peft model's."""
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for i, name in enumerate(model.lora.full_names):
            model.lora.lora_A[i].copy_(params[f"base_model.model.{name}.lora_A.default.weight"])
            model.lora.lora_B[i].copy_(params[f"base_model.model.{name}.lora_B.default.weight"])


async def test_lora_training_matches_local_peft(tiny_dirs, tmp_path, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    ref = _peft_adapter(model_dir, tmp_path / "init")
    swarm = await swarms.start(model_dir, [(0, 1), (1, 4)])
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS)
    model = await sdk_models.open(model_dir, swarm.token, tuning_mode="lora", lora_config=config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora." in n for n in trainable)
    assert len(model.lora.full_names) == 4 * len(TARGETS)
    _copy_from_peft(model, ref)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])

    loss, grads = await asyncio.to_thread(_lora_step, model, mask)
    _assert_grads_like_peft(ref, mask, loss, grads, model.lora.full_names)

    # a step of plain SGD, then: the saved adapter is what peft and --adapters read
    def train_and_save():
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        opt.step()
        model.save_lora(tmp_path / "trained")
        with torch.no_grad():
            return model(IDS).logits, model.generate(IDS[:1], max_new_tokens=4, do_sample=False)

    trained, tokens = await asyncio.to_thread(train_and_save)
    local = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    loaded = PeftModel.from_pretrained(local, tmp_path / "trained").eval()
    with torch.no_grad():
        want = loaded(IDS).logits
    assert (trained - want).abs().max() < 1e-4
    assert torch.equal(tokens, loaded.generate(input_ids=IDS[:1], max_new_tokens=4,
                                               do_sample=False))  # fmt: skip
    served = await swarms.start(model_dir, [(0, 3), (3, 4)],
                                adapters=(("trained", str(tmp_path / "trained")),))  # fmt: skip
    again = await sdk_models.open(model_dir, served.token, active_adapter="trained")
    got = await asyncio.to_thread(lambda: again(IDS).logits.detach())
    assert (got - want).abs().max() < 1e-4


def _lora_step(model, mask):
    """Loss of IDS on `model` and, after its backward, each LoRA module's (A, B) gradients."""
    out = model(IDS, attention_mask=mask, labels=IDS)
    out.loss.backward()
    return out.loss.detach(), [(a.grad.clone(), b.grad.clone())
                               for a, b in zip(model.lora.lora_A, model.lora.lora_B, strict=True)]  # fmt: skip


def _assert_grads_like_peft(ref, mask, loss, grads, names) -> None:
    """The loss and every LoRA A/B gradient within 1e-4 of the local peft model's."""
    ref.train()
    ref_out = ref(input_ids=IDS, attention_mask=mask, labels=IDS)
    ref_out.loss.backward()
    assert abs(loss.item() - ref_out.loss.item()) < 1e-4
    params = dict(ref.named_parameters())
    for (g_a, g_b), name in zip(grads, names, strict=True):
        want_a = params[f"base_model.model.{name}.lora_A.default.weight"].grad
        want_b = params[f"base_model.model.{name}.lora_B.default.weight"].grad
        assert want_a.abs().max() > 0 and want_b.abs().max() > 0, name
        assert (g_a - want_a).abs().max() < 1e-4, name
        assert (g_b - want_b).abs().max() < 1e-4, name


async def test_lora_gradients_sum_over_row_groups(tiny_dirs, tmp_path, swarms, sdk_models):
    """A batch sent as groups of one row each (forward_chunk_bytes=1): every group carries
    the same LoRA weights, their gradients summed equal peft's on the whole batch."""
    model_dir = tiny_dirs("llama")
    ref = _peft_adapter(model_dir, tmp_path / "init")
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token, tuning_mode="lora",
                                  lora_config=LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS),
                                  client_config=ClientConfig(forward_chunk_bytes=1))  # fmt: skip
    _copy_from_peft(model, ref)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])

    loss, grads = await asyncio.to_thread(_lora_step, model, mask)
    _assert_grads_like_peft(ref, mask, loss, grads, model.lora.full_names)


async def test_lora_survives_failover(tiny_dirs, tmp_path, swarms, sdk_models):
    """A server that ran a training forward dies before its backward, and one dies mid-
    generation: the replacements get the LoRA weights too (resent, or sent with the replay)."""
    from transformers import LogitsProcessorList

    from tests.client.faults import AtStep

    model_dir = tiny_dirs("llama")
    ref = _peft_adapter(model_dir, tmp_path / "init")
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4), (2, 4), (2, 4)])
    config = {"r": 4, "lora_alpha": 8, "target_modules": TARGETS}
    model = await sdk_models.open(model_dir, swarm.token, tuning_mode="lora", lora_config=config)
    _copy_from_peft(model, ref)
    loop = asyncio.get_running_loop()
    traces, forward = [], model.client.forward

    async def spy(*args, **kwargs):
        out, trace = await forward(*args, **kwargs)
        traces.append(trace)
        return out, trace

    model.client.forward = spy

    def stop(peer_id):
        asyncio.run_coroutine_threadsafe(swarm.stop(swarm.by_peer(peer_id)), loop).result()

    def remote():
        out = model(IDS, labels=IDS)
        stop(next(h.hop.peer_id for h in traces[0] if h.hop.start_block == 2))
        out.loss.backward()
        return [(a.grad.clone(), b.grad.clone())
                for a, b in zip(model.lora.lora_A, model.lora.lora_B, strict=True)]  # fmt: skip

    grads = await asyncio.to_thread(remote)
    ref.train()
    ref(input_ids=IDS, labels=IDS).loss.backward()
    params = dict(ref.named_parameters())
    for (g_a, g_b), name in zip(grads, model.lora.full_names, strict=True):
        assert (
            g_a - params[f"base_model.model.{name}.lora_A.default.weight"].grad
        ).abs().max() < 1e-4
        assert (
            g_b - params[f"base_model.model.{name}.lora_B.default.weight"].grad
        ).abs().max() < 1e-4

    killed = []

    def kill():
        hop = model._owned[0].session.spans[-1].hop
        stop(hop.peer_id)
        killed.append(hop.peer_id)

    ref.eval()
    want = ref.generate(input_ids=IDS[:1], max_new_tokens=12, do_sample=False)
    with torch.no_grad():
        got = await asyncio.to_thread(
            model.generate, IDS[:1], max_new_tokens=12, do_sample=False,
            logits_processor=LogitsProcessorList([AtStep(6, kill)]),
        )  # fmt: skip
    assert killed and torch.equal(got, want)


async def test_training_goes_on_from_a_saved_adapter(tiny_dirs, tmp_path, swarms, sdk_models):
    model_dir = tiny_dirs("llama")
    ref = _peft_adapter(model_dir, tmp_path / "saved", targets=["q_proj", "v_proj"])
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(model_dir, swarm.token, tuning_mode="lora",
                                  lora_config=str(tmp_path / "saved"))  # fmt: skip
    assert model.lora.settings.r == 4 and model.lora.settings.lora_alpha == 8
    with torch.no_grad():
        want = ref(IDS).logits
    got = await asyncio.to_thread(lambda: model(IDS).logits.detach())
    assert (got - want).abs().max() < 1e-4
    with pytest.raises(BadRequest, match="cannot read the LoRA adapter config"):
        await sdk_models.open(model_dir, swarm.token, tuning_mode="lora",
                              lora_config=str(tmp_path / "nowhere"))  # fmt: skip


@pytest.mark.slow
async def test_lora_loss_falls_on_smollm2(smollm2_dir, swarms, sdk_models):
    swarm = await swarms.start(smollm2_dir, [(0, 15), (15, 30)])
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    model = await sdk_models.open(smollm2_dir, swarm.token, tuning_mode="lora",
                                  lora_config=config)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.randint(0, 49152, (4, 6), generator=gen),
                     torch.tensor([[504, 2365, 3290]]).expand(4, -1)], dim=1)  # fmt: skip
    labels = ids.clone()
    labels[:, :6] = -100

    def train():
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
        losses = []
        for _ in range(4):
            opt.zero_grad()
            loss = model(ids, labels=labels).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    losses = await asyncio.to_thread(train)
    assert losses[-1] < losses[0] - 1.0, losses


async def test_served_adapter_on_quantized_spans(tiny_dirs, tmp_path, swarms, sdk_models):
    """int8 servers add the adapter on top of their quantized blocks: the adapter's effect on
    the logits is the float model's, within int8's error."""
    pytest.importorskip("bitsandbytes")
    model_dir = tiny_dirs("llama")
    ref = _peft_adapter(model_dir, tmp_path / "styled")
    swarm = await swarms.start(model_dir, [(0, 2), (2, 4)], quant_type="int8",
                               adapters=(("styled", str(tmp_path / "styled")),))  # fmt: skip
    adapted = await sdk_models.open(model_dir, swarm.token, active_adapter="styled")
    plain = await sdk_models.open(model_dir, swarm.token)
    with torch.no_grad():
        want = ref(IDS).logits
        with ref.disable_adapter():
            want_plain = ref(IDS).logits
        got = await asyncio.to_thread(lambda: adapted(IDS).logits)
        got_plain = await asyncio.to_thread(lambda: plain(IDS).logits)
    effect, want_effect = got - got_plain, want - want_plain
    assert (effect - want_effect).norm() / want_effect.norm() < 0.05
    assert (got - want).norm() / want.norm() < 0.05


async def test_lora_training_on_gemma4_across_a_kv_sharing_cut(tiny_dirs, tmp_path, swarms,
                                                                 sdk_models):  # fmt: skip
    """Gemma 4 with a cut inside a K/V-sharing group (per-layer inputs and shared K/V travel
    beside the LoRA weights): loss and every LoRA gradient equal local peft's."""
    model_dir = tiny_dirs("gemma4_text")
    ref = _peft_adapter(model_dir, tmp_path / "g4", targets=["q_proj", "v_proj", "down_proj"])
    swarm = await swarms.start(model_dir, [(0, 4), (4, 6)])
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    model = await sdk_models.open(model_dir, swarm.token, tuning_mode="lora", lora_config=config)
    _copy_from_peft(model, ref)
    ids = torch.randint(3, 249, (2, 7), generator=torch.Generator().manual_seed(0))

    def remote():
        out = model(ids, labels=ids)
        out.loss.backward()
        return out.loss.item(), [(a.grad, b.grad)
                                 for a, b in zip(model.lora.lora_A, model.lora.lora_B, strict=True)]  # fmt: skip

    loss, grads = await asyncio.to_thread(remote)
    ref.train()
    ref_loss = ref(input_ids=ids, labels=ids).loss
    ref_loss.backward()
    assert abs(loss - ref_loss.item()) < 1e-4
    params = dict(ref.named_parameters())
    for (g_a, g_b), name in zip(grads, model.lora.full_names, strict=True):
        want_a = params[f"base_model.model.{name}.lora_A.default.weight"].grad
        want_b = params[f"base_model.model.{name}.lora_B.default.weight"].grad
        assert (g_a - want_a).abs().max() < 1e-4 and (g_b - want_b).abs().max() < 1e-4, name
