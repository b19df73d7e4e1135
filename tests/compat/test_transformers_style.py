"""Code written for a local transformers model, run unchanged on the swarm: the manual cache
loop, hidden states per layer, pipeline(), length errors and empty steps, the remote cache's
lifetime. Each result is compared with the same code on the local model (1e-4)."""

from __future__ import annotations

import gc
import time

import pytest
import torch
import transformers
from transformers import DynamicCache

from drift.client import AutoDistributedModelForCausalLM, ClientConfig

FAMILIES = ("llama", "bloom", "gemma2", "gemma4_text")
TOL = 1e-4


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a - b).abs().max() < TOL)


def _decode_loop(model, ids, steps, **first):
    """The loop of transformers' docs: logits of the prompt and of each greedy token, fed
    back with the cache the previous call returned."""
    logits = []
    with torch.no_grad():
        out = model(ids, **first)
        logits.append(out.logits)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits)
    return logits, out.past_key_values


@pytest.mark.parametrize("first", [dict(use_cache=True), dict()], ids=["use_cache", "default"])
def test_manual_cache_loop(dist_model, local_model, tokenizer, first):
    ids = tokenizer("A cat sat on a mat", return_tensors="pt").input_ids
    got, cache = _decode_loop(dist_model, ids, 6, **first)
    want, _ = _decode_loop(local_model, ids, 6, **first)
    assert all(_close(g, w) for g, w in zip(got, want, strict=True))
    assert cache.get_seq_length() == ids.shape[1] + 6


def test_cache_keyword_and_padded_batch_with_growing_mask(dist_model, local_model, tokenizer):
    tokenizer.padding_side = "left"
    batch = tokenizer(["A cat sat on a mat", "A dog"], return_tensors="pt", padding=True)

    def loop(model):
        ids, mask = batch.input_ids, batch.attention_mask
        outs = []
        with torch.no_grad():
            out = model(ids, attention_mask=mask, use_cache=True)
            for _ in range(4):
                outs.append(out.logits[:, -1])
                nxt = out.logits[:, -1:].argmax(-1)
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
                out = model(nxt, attention_mask=mask, cache=out.cache, use_cache=True)
        return outs

    assert all(_close(g, w) for g, w in zip(loop(dist_model), loop(local_model), strict=True))


def test_cache_grows_past_its_first_reservation(swarm, model_dir, local_model, tokenizer, opened):
    model = AutoDistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=swarm.token, client_config=ClientConfig(cache_headroom_tokens=2)
    )
    opened.append(model)
    ids = tokenizer("A cat", return_tensors="pt").input_ids
    got, cache = _decode_loop(model, ids, 12, use_cache=True)
    want, _ = _decode_loop(local_model, ids, 12, use_cache=True)
    assert all(_close(g, w) for g, w in zip(got, want, strict=True))
    assert cache.session.max_length > ids.shape[1] + 2  # reopened longer, inputs replayed


def test_cache_grows_up_to_the_servers_limit_then_says_so(
    bg_swarms, model_dir, local_model, tokenizer, opened
):
    n = local_model.config.num_hidden_layers
    swarm = bg_swarms.start(model_dir, [(0, 2), (2, n)], inference_max_length=24)
    model = AutoDistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=swarm.token, client_config=ClientConfig(cache_headroom_tokens=4)
    )
    opened.append(model)
    ids = tokenizer("A cat", return_tensors="pt").input_ids  # 5 tokens: room for 9, then 18
    got, cache = _decode_loop(model, ids, 19, use_cache=True)  # 24: doubling would be 36
    want, _ = _decode_loop(local_model, ids, 19, use_cache=True)
    assert all(_close(g, w) for g, w in zip(got, want, strict=True))
    assert cache.session.max_length == 24
    with pytest.raises(ValueError, match="exceeds this server's limit of 24"), torch.no_grad():
        model(ids[:, :1], past_key_values=cache)


def test_a_local_cache_is_refused_not_ignored(dist_model, tokenizer):
    ids = tokenizer("A cat", return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="DynamicCache cannot hold this model's keys"):
        dist_model(ids, past_key_values=DynamicCache(), use_cache=True)
    with pytest.raises(ValueError, match="output_attentions"):
        dist_model(ids, output_attentions=True)


def test_session_closes_when_the_cache_is_collected(dist_model, swarm, bg_swarms, tokenizer):
    ids = tokenizer("A cat", return_tensors="pt").input_ids
    with torch.no_grad():
        out = dist_model(ids, use_cache=True)
    assert bg_swarms.open_sessions(swarm) == [1, 1]
    del out
    gc.collect()
    assert _eventually(lambda: bg_swarms.open_sessions(swarm) == [0, 0])


def test_with_and_close(swarm, bg_swarms, model_dir, tokenizer):
    ids = tokenizer("A cat", return_tensors="pt").input_ids
    with AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token) as m:
        with torch.no_grad():
            out = m(ids, use_cache=True)
        assert bg_swarms.open_sessions(swarm) == [1, 1]
    assert bg_swarms.open_sessions(swarm) == [0, 0]  # close() returned: the servers know
    with pytest.raises(RuntimeError, match="closed"):
        m(ids[:, :1], past_key_values=out.past_key_values)
    m.close()  # again: nothing to do


def test_length_errors_are_value_errors_and_empty_steps_send_nothing(
    dist_model, swarm, bg_swarms, tokenizer
):
    ids = tokenizer("A cat", return_tensors="pt").input_ids  # 5 tokens
    h = dist_model.config.hidden_size
    with torch.no_grad(), dist_model.transformer.h.inference_session(max_length=6) as sess:
        before = bg_swarms.steps_served(swarm)
        empty = sess.step(torch.empty(1, 0, h))
        assert empty.shape == (1, 0, h) and sess.position == 0
        assert bg_swarms.steps_served(swarm) == before
        embs = dist_model.transformer.word_embeddings(ids)
        per_layer = dist_model.model.per_layer(ids, embs, 0)  # Gemma 4's; None for others
        sess.step(embs, per_layer_inputs=per_layer)
        with pytest.raises(ValueError, match="max_length 6 exceeded"):
            sess.step(torch.zeros(1, 2, h))
        assert sess.position == 5  # the session is unharmed
    with dist_model.inference_session(max_length=6), pytest.raises(ValueError):
        dist_model.generate(ids, max_new_tokens=4)


def test_hidden_states_one_per_layer(dist_model, local_model, tokenizer):
    ids = tokenizer("A cat sat on a mat", return_tensors="pt").input_ids
    with torch.no_grad():
        got = dist_model(ids, output_hidden_states=True).hidden_states
        want = local_model(ids, output_hidden_states=True).hidden_states
        assert len(got) == len(want) == local_model.config.num_hidden_layers + 1
        assert all(_close(g, w) for g, w in zip(got, want, strict=True))
        # continuing from a cache, and through the base model (transformers' AutoModel use)
        nxt = ids[:, -1:]
        out = dist_model(ids[:, :-1], use_cache=True)
        ref = local_model(ids[:, :-1], use_cache=True)
        got = dist_model.model(nxt, cache=out.cache, output_hidden_states=True)
        want = local_model.base_model(nxt, cache=ref.cache, output_hidden_states=True)
    assert all(_close(g, w) for g, w in zip(got.hidden_states, want.hidden_states, strict=True))
    assert _close(got.last_hidden_state, want.last_hidden_state)


def test_generate_with_scores_and_hidden_states(dist_model, local_model, tokenizer):
    ids = tokenizer("A cat sat", return_tensors="pt").input_ids
    kw = dict(max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
              output_scores=True, output_hidden_states=True)  # fmt: skip
    got, want = dist_model.generate(ids, **kw), local_model.generate(ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert all(_close(g, w) for g, w in zip(got.scores, want.scores, strict=True))
    for g_step, w_step in zip(got.hidden_states, want.hidden_states, strict=True):
        assert all(_close(g, w) for g, w in zip(g_step, w_step, strict=True))


def test_pipeline(dist_model, local_model, tokenizer):
    kw = dict(max_new_tokens=8, do_sample=False)
    got = transformers.pipeline("text-generation", model=dist_model, tokenizer=tokenizer)
    want = transformers.pipeline("text-generation", model=local_model, tokenizer=tokenizer)
    assert got("A cat sat", **kw) == want("A cat sat", **kw)


def test_inputs_embeds_from_the_models_own_embeddings(dist_model, local_model, tokenizer):
    ids = tokenizer("A cat sat", return_tensors="pt").input_ids
    with torch.no_grad():
        embeds = local_model.get_input_embeddings()(ids)
        assert _close(dist_model.get_input_embeddings()(ids), embeds)
        assert _close(
            dist_model(inputs_embeds=embeds).logits, local_model(inputs_embeds=embeds).logits
        )


def test_return_dict_false_gives_a_tuple(dist_model, local_model, tokenizer):
    ids = tokenizer("A cat", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = dist_model(ids, return_dict=False, use_cache=False)[0]
        assert _close(logits, local_model(ids, return_dict=False, use_cache=False)[0])


def test_speculative_model_checks_several_tokens_per_step(swarm, bg_swarms, model_dir,
                                                          local_model, opened):  # fmt: skip
    from drift.client import AutoDistributedSpeculativeModel, DistributedModelForCausalLM

    model = AutoDistributedSpeculativeModel.from_pretrained(
        model_dir,
        initial_peers=swarm.token,
        small_model=local_model,  # a perfect draft
    )
    opened.append(model)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    start = bg_swarms.steps_served(swarm)
    plain = DistributedModelForCausalLM.generate(model, ids, max_new_tokens=20, do_sample=False)
    middle = bg_swarms.steps_served(swarm)
    got = model.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(got, local_model.generate(ids, max_new_tokens=20, do_sample=False))
    assert torch.equal(plain, got)
    # one step per token without a draft; drafts are checked several at a time
    assert middle - start == plain.shape[1] - ids.shape[1]
    assert bg_swarms.steps_served(swarm) - middle < middle - start


def _eventually(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
