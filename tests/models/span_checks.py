"""The span checks that run on every tiny family and again on real weights (SmolLM2, Gemma 3).

Each takes a `Tiny` (tests/models/tiny_spans.py) and asserts agreement with its full
transformers model: stateless forward, sessions (left padding, beam reorder, rollback) and
backward (input and deep-prompt gradients). The test_span_* modules and the real-model tests
call them; REAL_MODEL_CHECKS lists them.
"""

from __future__ import annotations

import torch

from tests.models.tiny_spans import Tiny

FORWARD_TOL = 1e-5  # logits of a span chain against the full model
GRAD_TOL = 1e-4  # gradients through span backward against autograd on the full model


def open_sessions(tiny: Tiny, batch: int, max_length: int = 16):
    return [span.new_session(batch_size=batch, max_length=max_length) for span in tiny.spans]


def step_sessions(tiny: Tiny, sessions, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Embed `ids`, step them through each span's session in turn, return the logits."""
    hidden = tiny.head.embed(ids)
    for session in sessions:
        hidden = session.step(hidden, **kwargs)
    return tiny.head.logits(hidden)


def stateless_forward_matches_full_model(tiny: Tiny) -> None:
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = tiny.reference(input_ids=ids).logits
        hidden = tiny.head.embed(ids)
        for span in tiny.spans:
            hidden = span(hidden)
    torch.testing.assert_close(tiny.head.logits(hidden), ref, atol=FORWARD_TOL, rtol=0)


def left_padded_batch_matches_each_sequence_alone(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(8)
    lengths = [5, 3, 6]
    prompts = [torch.randint(0, 256, (1, n), generator=gen) for n in lengths]
    steps = torch.randint(0, 256, (3, 3), generator=gen)  # 3 more tokens per sequence
    width = max(lengths)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.shape[1] :] = prompt
        mask[row, width - prompt.shape[1] :] = 1
    batch = open_sessions(tiny, 3)
    outs = [step_sessions(tiny, batch, ids, attention_mask=mask)[:, -1]]
    outs += [step_sessions(tiny, batch, steps[:, i : i + 1])[:, -1] for i in range(3)]
    stateless = _run_stateless(
        tiny, torch.cat([ids, steps], 1), torch.cat([mask, torch.ones(3, 3, dtype=torch.long)], 1)
    )
    for row, prompt in enumerate(prompts):
        alone = open_sessions(tiny, 1)
        expected = [step_sessions(tiny, alone, prompt)[:, -1]]
        expected += [
            step_sessions(tiny, alone, steps[row : row + 1, i : i + 1])[:, -1] for i in range(3)
        ]
        for got, want in zip(outs, expected, strict=True):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got[row : row + 1], want, atol=tiny.batch_tol, rtol=0)
        torch.testing.assert_close(stateless[row, -1:], expected[-1], atol=tiny.batch_tol, rtol=0)


def _run_stateless(tiny: Tiny, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    hidden = tiny.head.embed(ids)
    for span in tiny.spans:
        hidden = span(hidden, attention_mask=mask)
    return tiny.head.logits(hidden)


def _alone(tiny: Tiny, ids: torch.Tensor) -> torch.Tensor:
    """Last-token logits of each row run from scratch, without a cache."""
    hidden = tiny.head.embed(ids)
    for span in tiny.spans:
        hidden = span(hidden)
    return tiny.head.logits(hidden)[:, -1]


def beam_reorder_matches_reordered_histories(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(9)
    history = torch.randint(0, 256, (3, 6), generator=gen)
    sessions = open_sessions(tiny, 3)
    step_sessions(tiny, sessions, history)
    hypo_ids = torch.tensor([2, 0, 0])
    new = torch.randint(0, 256, (3, 1), generator=gen)
    got = step_sessions(tiny, sessions, new, hypo_ids=hypo_ids)[:, -1]
    expected = _alone(tiny, torch.cat([history[hypo_ids], new], dim=1))
    torch.testing.assert_close(got, expected, atol=tiny.batch_tol, rtol=0)
    more = torch.randint(0, 256, (3, 1), generator=gen)
    got = step_sessions(tiny, sessions, more, hypo_ids=torch.tensor([1, 2, 0]))[:, -1]
    rows = torch.cat([history[hypo_ids], new], dim=1)[torch.tensor([1, 2, 0])]
    torch.testing.assert_close(
        got, _alone(tiny, torch.cat([rows, more], 1)), atol=tiny.batch_tol, rtol=0
    )


def rollback_matches_a_fresh_run(tiny: Tiny) -> None:
    """Roll back past the sliding window (4) and continue with other tokens."""
    gen = torch.Generator().manual_seed(10)
    prompt = torch.randint(0, 256, (1, 6), generator=gen)
    sessions = open_sessions(tiny, 1)
    step_sessions(tiny, sessions, prompt)
    for _ in range(4):
        step_sessions(tiny, sessions, torch.randint(0, 256, (1, 1), generator=gen))
    assert sessions[0].position == 10
    other = torch.randint(0, 256, (1, 2), generator=gen)
    got = step_sessions(tiny, sessions, other, position=5)
    assert [s.position for s in sessions] == [7, 7]
    history = torch.cat([prompt[:, :5], other], dim=1)
    expected = _alone(tiny, history)
    torch.testing.assert_close(got[:, -1], expected, atol=tiny.batch_tol, rtol=0)
    nxt = torch.randint(0, 256, (1, 1), generator=gen)
    got = step_sessions(tiny, sessions, nxt)[:, -1]
    torch.testing.assert_close(
        got, _alone(tiny, torch.cat([history, nxt], 1)), atol=tiny.batch_tol, rtol=0
    )


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


def input_grads_match_full_model(tiny: Tiny) -> None:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (2, 6), generator=gen)
    weights = torch.randn(2, 6, tiny.reference.config.vocab_size, generator=gen)
    got, _ = _spans_backward(tiny, ids, weights)
    ref, _ = _reference(tiny, ids, weights)
    assert ref is not None and ref.abs().max() > 0
    torch.testing.assert_close(got, ref, atol=GRAD_TOL, rtol=0)


def deep_prompt_grads_match_hooked_full_model(tiny: Tiny) -> None:
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
    torch.testing.assert_close(got_p, ref_p, atol=GRAD_TOL, rtol=0)
    torch.testing.assert_close(got_h, ref_h, atol=GRAD_TOL, rtol=0)


REAL_MODEL_CHECKS = [
    stateless_forward_matches_full_model,
    left_padded_batch_matches_each_sequence_alone,
    beam_reorder_matches_reordered_histories,
    rollback_matches_a_fresh_run,
    input_grads_match_full_model,
    deep_prompt_grads_match_hooked_full_model,
]
