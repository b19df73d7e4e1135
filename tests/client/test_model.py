"""The distributed model against local transformers on the same tiny weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.server.reference import load_reference


@pytest.mark.parametrize("family", ["llama"])
async def test_logits_match_local(tiny_dirs, family, swarm_model):
    model_dir = tiny_dirs(family)
    local = load_reference(model_dir)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))

    def check(model):
        with torch.no_grad():
            out = model(ids)
            ref = local(ids)
        assert (out.logits - ref.logits).abs().max() < 1e-4
        greedy = model.generate(ids, max_new_tokens=6, do_sample=False)
        ref_greedy = local.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(greedy, ref_greedy)

    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    await asyncio.to_thread(check, model)


@pytest.mark.parametrize(
    "family",
    ["qwen2", "mistral", "gemma2", "falcon", "bloom", "gemma3_text", "mixtral", "qwen3",
     "qwen3_moe", "deepseek_v3", "falcon_alibi"],
)  # fmt: skip
async def test_families_logits_and_greedy(tiny_dirs, family, swarm_model):
    model_dir = tiny_dirs(family)
    local = load_reference(model_dir)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))

    def check(model):
        with torch.no_grad():
            assert (model(ids).logits - local(ids).logits).abs().max() < 1e-4
        ref = local.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), ref)

    n = _num_layers(local)
    _, model = await swarm_model(model_dir, [(0, 2), (2, n)])
    await asyncio.to_thread(check, model)


def _num_layers(local) -> int:
    cfg = local.config
    return int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)


async def test_generate_modes(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))

    def check(model):
        for kw in (
            dict(do_sample=True, top_k=20, temperature=0.9),
            dict(num_beams=3, do_sample=False),
            dict(repetition_penalty=1.5, do_sample=False),
            dict(use_cache=False, do_sample=False),  # no session: whole sequence each step
        ):
            torch.manual_seed(7)
            ref = local.generate(ids, max_new_tokens=8, **kw)
            torch.manual_seed(7)
            out = model.generate(ids, max_new_tokens=8, **kw)
            assert torch.equal(out, ref), kw
        # several generate calls in one session continue where the last stopped; each
        # returns what it was given and its new tokens (None: the new tokens only, as Petals)
        ref = local.generate(ids, max_new_tokens=8, do_sample=False)
        with model.inference_session(max_length=32):
            first = model.generate(ids, max_new_tokens=4, do_sample=False)
            second = model.generate(None, max_new_tokens=4, do_sample=False)
        assert torch.equal(first, ref[:, :9])
        assert torch.equal(second, ref[:, 9:])
        with model.inference_session(max_length=32):  # the whole sequence given: all back
            first = model.generate(ids, max_new_tokens=4, do_sample=False)
            assert torch.equal(model.generate(first, max_new_tokens=4, do_sample=False), ref)

    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    await asyncio.to_thread(check, model)


async def test_padded_batch_matches_each_prompt_alone(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)
    a = torch.tensor([[5, 6, 7, 8, 9]])
    b = torch.tensor([[11, 12]])
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 0, 11, 12]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])

    def check(model):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
        ref_a = local.generate(a, max_new_tokens=5, do_sample=False)
        ref_b = local.generate(b, max_new_tokens=5, do_sample=False)
        assert torch.equal(out[0], ref_a[0])
        assert torch.equal(out[1, 3:], ref_b[0])

    _, model = await swarm_model(model_dir, [(0, 3), (3, 4)])
    await asyncio.to_thread(check, model)


async def test_missing_blocks_named(tiny_dirs, swarm_model):
    from drift.wire.errors import MissingBlocks

    model_dir = tiny_dirs("llama")

    def check(model):
        with pytest.raises(MissingBlocks, match="2-3"):
            model(torch.tensor([[1, 2, 3]]))

    _, model = await swarm_model(model_dir, [(0, 2)])
    await asyncio.to_thread(check, model)


async def test_sliced_layers_and_gradients(tiny_dirs, swarm_model):
    model_dir = tiny_dirs("llama")
    local = load_reference(model_dir)

    def check(model):
        hidden = torch.randn(2, 4, 64, requires_grad=True)
        out = model.model.layers[1:3](hidden)
        ref_in = hidden.detach().clone().requires_grad_(True)
        ref = ref_in
        pos = torch.arange(4).unsqueeze(0).expand(2, -1)
        emb = local.model.rotary_emb(ref, pos)
        from transformers.masking_utils import create_causal_mask

        causal = create_causal_mask(config=local.config, inputs_embeds=ref, attention_mask=None,
                                    cache=None, position_ids=pos)  # fmt: skip
        for layer in local.model.layers[1:3]:
            ref = layer(ref, attention_mask=causal, position_embeddings=emb, position_ids=pos)
            ref = ref[0] if isinstance(ref, tuple) else ref
        assert (out - ref).abs().max() < 1e-4
        out.square().sum().backward()
        ref.square().sum().backward()
        assert (hidden.grad - ref_in.grad).abs().max() < 1e-4

    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    await asyncio.to_thread(check, model)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
async def test_output_hidden_states_one_per_block_as_hf(tiny_dirs, family, swarm_model):
    model_dir = tiny_dirs(family)
    local = load_reference(model_dir)
    ids = torch.tensor([[3, 14, 15, 92, 65]])

    def check(model):
        with torch.no_grad():
            plain = model(ids)
            out = model(ids, output_hidden_states=True)
            ref = local(ids, output_hidden_states=True)
        assert plain.hidden_states is None
        assert len(out.hidden_states) == len(ref.hidden_states) == 5
        for got, want in zip(out.hidden_states, ref.hidden_states, strict=True):
            assert (got - want).abs().max() < 1e-4
        # a per-layer state is also the output of running the first k blocks explicitly
        with torch.no_grad():
            mid = model.model.layers[:2](out.hidden_states[0])
        assert (mid - ref.hidden_states[2]).abs().max() < 1e-4

    _, model = await swarm_model(model_dir, [(0, 2), (2, 4)])
    await asyncio.to_thread(check, model)
