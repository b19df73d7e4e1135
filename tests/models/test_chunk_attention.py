"""drift.models.attention: a prompt chunk after a past attends without a materialised mask,
with the numbers of transformers' SDPA over the [T, past + T] mask, and falls back to that
path wherever its own does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drift.models.attention import AfterPast, chunk_attention, drift_sdpa


def masked(q, k, v, past, scale):
    mask = AfterPast(past, q.shape[2]).materialize(q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


@pytest.mark.parametrize(("heads", "kv_heads", "past", "tokens"),
                         [(4, 4, 5, 3), (6, 2, 37, 9), (8, 1, 1, 2), (9, 3, 300, 64)])  # fmt: skip
def test_equals_the_masked_sdpa(heads, kv_heads, past, tokens):
    gen = torch.Generator().manual_seed(past)
    q = torch.randn(2, heads, tokens, 16, generator=gen)
    k = torch.randn(2, kv_heads, past + tokens, 16, generator=gen)
    v = torch.randn(2, kv_heads, past + tokens, 16, generator=gen)
    got = chunk_attention(q, k, v, past, 0.25)
    torch.testing.assert_close(got, masked(q, k, v, past, 0.25), atol=1e-5, rtol=1e-5)


def test_the_attention_function_returns_transformers_layout_and_falls_back():
    """[B, T, H, D] as transformers' attention functions; with gradients on, or value heads
    of another size than the queries' (DeepSeek-V3), transformers' own path on the mask."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 8, generator=gen)
    k = torch.randn(1, 2, 10, 8, generator=gen)
    v = torch.randn(1, 2, 10, 8, generator=gen)
    module = torch.nn.Module()
    module.is_causal = True
    module.num_key_value_groups = 2
    want = masked(q, k, v, 7, 0.5).transpose(1, 2)
    with torch.no_grad():
        out, weights = drift_sdpa(module, q, k, v, AfterPast(7, 3), scaling=0.5)
    assert weights is None
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    with torch.enable_grad():  # gradients: the materialised mask
        out, _ = drift_sdpa(module, q.requires_grad_(), k, v, AfterPast(7, 3), scaling=0.5)
    torch.testing.assert_close(out.detach(), want, atol=1e-6, rtol=1e-6)
    v12 = torch.randn(1, 2, 10, 12, generator=gen)  # value heads of another size
    with torch.no_grad():
        out, _ = drift_sdpa(module, q.detach(), k, v12, AfterPast(7, 3), scaling=0.5)
        want12 = masked(q.detach(), k, v12, 7, 0.5).transpose(1, 2)
    torch.testing.assert_close(out, want12, atol=1e-6, rtol=1e-6)


def test_every_family_whose_chunks_can_take_this_path_takes_it(tiny, monkeypatch):
    """A prompt in two pieces through each span's session: the second piece's full-attention
    layers of the llama-like families run chunk_attention (DeepSeek-V3's too: the tiny one's
    value heads are the queries' size); logits equal transformers in one pass."""
    import drift.models.attention as attention
    from tests.models.span_checks import FORWARD_TOL, step_sessions

    calls = []
    real = attention.chunk_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "chunk_attention", counted)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = tiny.reference(input_ids=ids).logits
        sessions = [span.new_session(batch_size=2, max_length=9) for span in tiny.spans]
        got = torch.cat([step_sessions(tiny, sessions, ids[:, :5]),
                         step_sessions(tiny, sessions, ids[:, 5:])], dim=1)  # fmt: skip
    torch.testing.assert_close(got, ref, atol=FORWARD_TOL, rtol=0)
    config = tiny.reference.config
    full = [i for i in range(config.num_hidden_layers)
            if (getattr(config, "layer_types", None) or ["full_attention"] * 64)[i] == "full_attention"]  # fmt: skip
    takes = (tiny.family in ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", "mistral",
                             "deepseek_v3")
             and getattr(config, "sliding_window", None) is None)  # fmt: skip
    assert len(calls) == (len(full) if takes else 0), (tiny.family, calls)
