"""Backward through two spans equals autograd through the full transformers model."""

from __future__ import annotations

import torch

from tests.models.conftest import Tiny

TOL = 1e-4


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = model.base_model
    return base.h if hasattr(base, "h") else base.layers


def _spans_backward(tiny: Tiny, ids, weights, prompts=None):
    """Client-side chain: embed, spans forward, head loss, then each span's backward."""
    h0 = tiny.head.embed(ids)
    p0 = p1 = None
    if prompts is not None:
        p0, p1 = prompts[: tiny.split], prompts[tiny.split :]
    h1 = tiny.spans[0](h0, prompts=p0)
    h2 = tiny.spans[1](h1, prompts=p1).requires_grad_(True)
    loss = (tiny.head.logits(h2) * weights).sum()
    (g2,) = torch.autograd.grad(loss, [h2])
    g1, gp1 = tiny.spans[1].backward(h1, g2, prompts=p1)
    g0, gp0 = tiny.spans[0].backward(h0, g1, prompts=p0)
    grad_prompts = None if prompts is None else torch.cat([gp0, gp1])
    return g0, grad_prompts


def _reference(tiny: Tiny, ids, weights, prompts=None):
    """Full HF model; the input of block 0 is captured, prompts are added by pre-hooks."""
    captured = {}
    layers = _decoder_layers(tiny.reference)

    def capture(module, args):
        captured["h"] = args[0]
        args[0].retain_grad()

    def add_prompt(index):
        def hook(module, args):
            hidden = args[0]
            length = prompts.shape[2]
            head = hidden[:, :length] + prompts[index]
            return (torch.cat([head, hidden[:, length:]], dim=1), *args[1:])

        return hook

    handles = [layers[0].register_forward_pre_hook(capture)]
    if prompts is not None:
        handles += [
            layer.register_forward_pre_hook(add_prompt(i)) for i, layer in enumerate(layers)
        ]
    try:
        logits = tiny.reference(input_ids=ids, use_cache=False).logits
        (logits * weights).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        tiny.reference.zero_grad(set_to_none=True)
    return captured["h"].grad, None if prompts is None else prompts.grad


def test_input_grads_match_full_model(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (2, 6), generator=gen)
    weights = torch.randn(2, 6, tiny.reference.config.vocab_size, generator=gen)
    got, _ = _spans_backward(tiny, ids, weights)
    ref, _ = _reference(tiny, ids, weights)
    assert ref is not None and ref.abs().max() > 0
    torch.testing.assert_close(got, ref, atol=TOL, rtol=0)


def test_deep_prompt_grads_match_hooked_full_model(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 256, (2, 6), generator=gen)
    weights = torch.randn(2, 6, tiny.reference.config.vocab_size, generator=gen)
    hidden = tiny.reference.config.hidden_size
    prompts = torch.randn(tiny.num_layers, 2, 3, hidden, generator=gen) * 0.1
    got_h, got_p = _spans_backward(tiny, ids, weights, prompts)
    leaf = prompts.clone().requires_grad_(True)
    ref_h, ref_p = _reference(tiny, ids, weights, leaf)
    assert got_p is not None and got_p.shape == prompts.shape
    assert ref_p.abs().max() > 0
    torch.testing.assert_close(got_p, ref_p, atol=TOL, rtol=0)
    torch.testing.assert_close(got_h, ref_h, atol=TOL, rtol=0)


def test_deep_prompts_change_the_output_only_through_their_positions(tiny: Tiny) -> None:
    """Prompts are added to positions [0, P) before each block, also inside a session."""
    span = tiny.spans[1]
    n = span.end_block - span.start_block
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(1, 5, tiny.reference.config.hidden_size, generator=gen)
    prompts = torch.randn(n, 1, 2, hidden.shape[-1], generator=gen)
    stateless = span(hidden, prompts=prompts)
    assert not torch.allclose(stateless, span(hidden), atol=1e-3)
    session = span.new_session(batch_size=1, max_length=5)
    stepped = torch.cat(
        [
            session.step(hidden[:, :1], prompts=prompts),
            session.step(hidden[:, 1:], prompts=prompts),
        ],
        dim=1,
    )
    torch.testing.assert_close(stepped, stateless, atol=1e-5, rtol=0)
