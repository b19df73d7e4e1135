"""Gemma 4 split into spans, per-layer inputs and shared K/V passed between them, against
the full transformers model: dense, MoE, Unified (k = v) and the multimodal checkpoint's
text tower, cut at every boundary that separates a donor from its consumer and at one that
does not (gemma4_helpers.CUTS)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from drift.models.checkpoint import Checkpoint
from drift.models.head import ClientHead
from drift.models.sharing import KVSharing
from drift.models.span import ModelSpan
from drift.wire.errors import BadRequest, BadTensor
from drift.wire.extras import PER_LAYER_INPUTS, kv_names
from drift.wire.messages import StepRequest
from tests.models.gemma4_helpers import (
    CUTS,
    G4,
    ChainSession,
    chain_backward,
    chain_forward,
    load_g4,
)
from tests.tiny_models import GEMMA4_FAMILIES, tiny_config

LOGITS_TOL = 1e-5
GRAD_TOL = 1e-4
PROMPT = 11  # > the sliding window (8): sliding layers and their shared K/V drop old tokens


@pytest.fixture(scope="module", params=GEMMA4_FAMILIES)
def g4(request, tmp_path_factory) -> G4:
    return load_g4(request.param, tmp_path_factory.mktemp(request.param))


def _ids(batch: int, tokens: int, seed: int = 0) -> torch.Tensor:
    # < 249: clear of the multimodal checkpoint's image/audio placeholder ids
    return torch.randint(3, 249, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _ref_steps(g: G4, ids: torch.Tensor, steps: torch.Tensor, mask=None) -> list[torch.Tensor]:
    """The reference's own cached decoding: prompt logits, then one logits per step."""
    cache = DynamicCache(config=g.reference.config.get_text_config())
    out = [g.reference(ids, attention_mask=mask, cache=cache, use_cache=True).logits]
    for i in range(steps.shape[1]):
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        out.append(g.reference(steps[:, i : i + 1], attention_mask=mask, cache=cache,
                               use_cache=True).logits)  # fmt: skip
    return out


@torch.no_grad()
@pytest.mark.parametrize("cuts", CUTS)
def test_forward_and_five_steps_match_transformers(g4, cuts):
    ids, steps = _ids(2, PROMPT), _ids(2, 5, seed=1)
    embeds = g4.head.embed(ids)
    hidden, _ = chain_forward(g4, g4.spans(cuts), embeds, g4.head.per_layer_inputs(ids, embeds))
    want = _ref_steps(g4, ids, steps)
    assert (g4.head.logits(hidden) - want[0]).abs().max() < LOGITS_TOL
    session = ChainSession(g4, cuts, batch_size=2, max_length=32)
    got = [session.step(ids, position=0)]
    got += [session.step(steps[:, i : i + 1], position=PROMPT + i) for i in range(5)]
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert (a - b).abs().max() < LOGITS_TOL, f"step {i}"


@torch.no_grad()
@pytest.mark.parametrize("cuts", CUTS)
def test_greedy_twenty_tokens_identical(g4, cuts):
    ids = _ids(1, 6, seed=2)
    ref_tokens, cache, nxt = [], DynamicCache(config=g4.reference.config.get_text_config()), ids
    session = ChainSession(g4, cuts, batch_size=1, max_length=32)
    got_tokens, position, cur = [], 0, ids
    for _ in range(20):
        nxt = g4.reference(nxt, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
        ref_tokens.append(int(nxt))
        logits = session.step(cur, position=position)
        position += cur.shape[1]
        cur = logits[:, -1:].argmax(-1)
        got_tokens.append(int(cur))
    assert got_tokens == ref_tokens


@torch.no_grad()
@pytest.mark.parametrize("cuts", [(3,), (3, 5)])
def test_padded_batch_and_beam_reorder(g4, cuts):
    ids, steps = _ids(3, PROMPT, seed=3), _ids(3, 3, seed=4)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :1] = 0
    want = _ref_steps(g4, ids, steps, mask)
    session = ChainSession(g4, cuts, batch_size=3, max_length=32)
    got = [session.step(ids, position=0, mask=mask)]
    got += [session.step(steps[:, i : i + 1], position=PROMPT + i) for i in range(3)]
    real = mask.bool()
    assert (got[0] - want[0])[real].abs().max() < LOGITS_TOL
    for a, b in zip(got[1:], want[1:], strict=True):
        assert (a - b).abs().max() < LOGITS_TOL
    # beam search: rows reordered (received K/V included) before the next step
    hypo = torch.tensor([2, 0, 0])
    cache = DynamicCache(config=g4.reference.config.get_text_config())
    g4.reference(ids, attention_mask=mask, cache=cache, use_cache=True)
    full_mask = torch.cat([mask, mask.new_ones(3, 3)], dim=1)
    for i in range(3):
        g4.reference(steps[:, i : i + 1], attention_mask=full_mask[:, : PROMPT + i + 1],
                     cache=cache, use_cache=True)  # fmt: skip
    cache.reorder_cache(hypo)
    nxt = _ids(3, 1, seed=5)
    ref_mask = torch.cat([full_mask[hypo], full_mask.new_ones(3, 1)], dim=1)
    want_beam = g4.reference(nxt, attention_mask=ref_mask, cache=cache, use_cache=True).logits
    got_beam = session.step(nxt, position=PROMPT + 3, hypo_ids=hypo)
    assert (got_beam - want_beam).abs().max() < LOGITS_TOL


@torch.no_grad()
def test_rollback_rebuilds_the_received_keys_and_values(g4):
    ids, steps = _ids(1, PROMPT, seed=6), _ids(1, 4, seed=7)
    session = ChainSession(g4, (4,), batch_size=1, max_length=32)
    session.step(ids, position=0)
    session.step(steps[:, :3], position=PROMPT)  # the consumer span keeps 14 positions of K/V
    got = session.step(steps[:, 3:], position=PROMPT + 1)  # back to 12, then a new token
    seq = torch.cat([ids, steps[:, :1], steps[:, 3:]], dim=1)
    want = g4.reference(seq).logits[:, -1:]
    assert (got - want).abs().max() < LOGITS_TOL


@pytest.mark.parametrize("cuts", CUTS)
def test_backward_gradients_match_transformers(g4, cuts):
    """d(loss)/d(embeddings) through hidden states, per-layer inputs and shared K/V."""
    ids = _ids(2, 9, seed=8)
    weights = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(9))
    text = g4.text_model
    embeds = text.embed_tokens(ids).detach().requires_grad_(True)
    kwargs = {}
    if g4.head.per_layer is not None:
        kwargs["per_layer_inputs"] = text.get_per_layer_inputs(ids, None).detach()
    out = text(inputs_embeds=embeds, **kwargs).last_hidden_state  # normed, as head.norm gives
    (want,) = torch.autograd.grad((out * weights).sum(), [embeds])

    mine = embeds.detach().clone().requires_grad_(True)
    per_layer = g4.head.per_layer_inputs(ids, mine)
    hidden, hops = chain_forward(g4, g4.spans(cuts), mine.detach(),
                                 None if per_layer is None else per_layer.detach())  # fmt: skip
    last = hidden.detach().requires_grad_(True)
    (grad_last,) = torch.autograd.grad((g4.head.norm(last) * weights).sum(), [last])
    grad_in, grad_per_layer = chain_backward(hops, grad_last, per_layer)
    got = grad_in
    if per_layer is not None:
        (through,) = torch.autograd.grad(per_layer, [mine], grad_per_layer)
        got = got + through
    assert (got - want).abs().max() < GRAD_TOL


@torch.no_grad()
def test_multimodal_placeholders_enter_the_text_tower_as_pad(g4):
    """Image/audio/video stand-in ids (no features: DRIFT serves text) embed as the pad
    token, in the embeddings and the per-layer inputs, as Gemma4Model does."""
    ids = _ids(1, 10, seed=10)
    ids[0, 2], ids[0, 5], ids[0, 7] = 250, 251, 252  # image, video, audio ids in tiny gemma4
    embeds = g4.head.embed(ids)
    hidden, _ = chain_forward(g4, g4.spans((3, 5)), embeds, g4.head.per_layer_inputs(ids, embeds))
    assert (g4.head.logits(hidden) - g4.reference(ids).logits).abs().max() < LOGITS_TOL
    pad = g4.head.embed(torch.zeros_like(ids))
    assert torch.equal(embeds[0, 2], pad[0, 2]) == (g4.family == "gemma4")


@torch.no_grad()
def test_per_layer_inputs_from_embeddings_alone(g4):
    """Without ids (generate from inputs_embeds) they are recovered from exact rows."""
    if g4.head.per_layer is None:
        assert g4.head.per_layer_inputs(None, torch.randn(1, 2, 64)) is None
        return
    ids = _ids(2, 6, seed=11)
    embeds = g4.head.embed(ids)
    assert torch.equal(
        g4.head.per_layer_inputs(None, embeds), g4.head.per_layer_inputs(ids, embeds)
    )
    with pytest.raises(BadTensor, match="pass input_ids"):
        g4.head.per_layer_inputs(None, embeds + 0.01)


def test_sharing_plan_of_the_tiny_config():
    sharing = KVSharing.from_config(tiny_config("gemma4_text"))
    assert sharing.donors == (("full_attention", 2), ("sliding_attention", 3))
    assert sharing.consumers == {4, 5}
    assert sharing.consumed(4, 6) == (2, 3) and sharing.consumed(3, 6) == (2,)
    assert sharing.consumed(0, 6) == () and sharing.consumed(5, 6) == (2,)
    assert sharing.donated(0, 3, 6) == (2,) and sharing.donated(0, 4, 6) == (2, 3)
    assert sharing.donated(3, 5, 6) == () and sharing.donated(0, 5, 6) == (2,)
    assert sharing.cache_slot(4) == 3 and sharing.cache_slot(5) == 2 and sharing.cache_slot(1) == 1
    assert KVSharing.from_config(tiny_config("llama")) == KVSharing()


def test_servers_and_client_read_only_the_text_tower(g4, monkeypatch):
    """Blocks read only their own tensors; the client only embeddings, PLE, norm (and head):
    never a vision or audio tensor of the multimodal checkpoint."""
    read: list[str] = []
    original = Checkpoint.tensors

    def spy(self, prefix):
        found = original(self, prefix)
        read.extend(prefix + name for name in found)
        return found

    monkeypatch.setattr(Checkpoint, "tensors", spy)
    ModelSpan.load(g4.ckpt, 2, 5)
    ClientHead.load(g4.ckpt)
    text = "model.language_model." if g4.family == "gemma4" else "model."
    assert read and all(name.startswith((text, "lm_head.")) for name in read), read
    layers = {int(n.split(".layers.")[1].split(".")[0]) for n in read if ".layers." in n}
    assert layers == {2, 3, 4}
    if g4.family == "gemma4":
        assert any("vision" in n or "audio" in n for n in g4.ckpt.tensor_names())


def test_missing_or_wrong_extras_are_refused_by_name(g4):
    span = g4.spans((4,))[1]  # blocks 4, 5: read the K/V of donors 3 and 2
    hidden = torch.randn(1, 3, 64)
    with pytest.raises(BadTensor, match=r"missing tensors \['.*kv\.2\.k"):
        span.forward(hidden)
    session = span.new_session(batch_size=1, max_length=8)
    spec = session.limits.extras
    assert {name for name, _ in spec.inputs} >= {*kv_names(2), *kv_names(3)}
    good = {
        n: torch.randn(*(1 if d == "B" else 3 if d == "T" else d for d in s))
        for n, s in spec.inputs
    }
    bad = dict(good)
    bad[kv_names(3)[0]] = torch.randn(1, 2, 3, 7)
    with pytest.raises(BadTensor, match=r"kv\.3\.k has shape \[1, 2, 3, 7\]"):
        session.step(hidden, extras=bad)
    params = {"type": "step", "version": "1.0", "step_id": 1, "position": 0, "donate": [4]}
    with pytest.raises(BadRequest, match="cannot donate"):
        StepRequest.from_wire(params, {"hidden_states": hidden, **good}, limits=session.limits)
    assert session.position == 0  # nothing ran
    out = session.step(hidden, extras=good)
    assert out.shape == hidden.shape and session.position == 3
    if g4.head.per_layer is not None:
        assert PER_LAYER_INPUTS in good
