"""The lean decode step (drift.models.static_step) against transformers and the eager path.

Float32 logits within 1e-4 of the full transformers model over several decode steps, alone
and batched with another session of another length and left padding, through rollback and a
beam reorder; bfloat16 within bf16's tolerance; families it does not cover are refused (the
server then runs them eagerly).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from drift.models.batch import BatchStep
from drift.models.checkpoint import Checkpoint
from drift.models.head import ClientHead
from drift.models.span import ModelSpan
from drift.models.static_step import LeanDecoder, refusal
from drift.server.compiled import DecodeUnit
from tests.models.tiny_spans import make_tiny
from tests.tiny_models import save_tiny

LEAN = ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "gemma2", "gemma3_text",
        "falcon", "falcon_alibi", "bloom", "deepseek_v3")  # fmt: skip


def _lean_logits(tiny, ids: torch.Tensor, steps: int, mask: torch.Tensor | None = None):
    """Greedy decode through the two spans: prefill eager, then `steps` lean steps; returns
    each step's logits [B, V] and the reference's, for the same tokens."""
    decoders = [LeanDecoder(span) for span in tiny.spans]
    sessions = [span.new_session(batch_size=ids.shape[0], max_length=64) for span in tiny.spans]
    cache = DynamicCache(config=tiny.reference.config)
    ours, theirs = [], []
    with torch.no_grad():
        hidden = tiny.head.embed(ids)
        for s in sessions:
            hidden = s.run(0, hidden, attention_mask=mask)[0]
        full_mask = mask
        ref = tiny.reference(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
        nxt = ref.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(steps):
            if full_mask is not None:
                full_mask = torch.cat([full_mask, torch.ones_like(nxt)], dim=1)
            ref = tiny.reference(input_ids=nxt, attention_mask=full_mask, cache=cache,
                                 use_cache=True)  # fmt: skip
            hidden = tiny.head.embed(nxt)
            for s, d in zip(sessions, decoders, strict=True):
                hidden = d.run([BatchStep(s, s.position, hidden)])[0]
            ours.append(tiny.head.logits(hidden)[:, -1])
            theirs.append(ref.logits[:, -1])
            nxt = theirs[-1].argmax(-1, keepdim=True)
    return ours, theirs


def _assert_lean_matches(tiny) -> None:
    """Six lean steps of two rows, with and without left padding: within 1e-4 of transformers."""
    assert all(refusal(span) is None for span in tiny.spans)
    ids = torch.tensor([[3, 17, 42, 99, 7], [5, 5, 11, 23, 200]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    for m in (None, mask):
        ours, theirs = _lean_logits(tiny, ids, 6, m)
        worst = max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True))
        assert worst < 1e-4, (m is not None, worst)


@pytest.mark.parametrize("family", LEAN)
def test_lean_steps_match_transformers(family, tiny_dirs) -> None:
    _assert_lean_matches(make_tiny(family, tiny_dirs[family]))


def _variant(tiny_dirs, tmp_path, family: str, **changes):
    """The tiny `family` with its config changed."""
    directory = tmp_path / f"{family}-variant"
    shutil.copytree(tiny_dirs[family], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    return make_tiny(family, directory)


def test_mistral_without_a_sliding_window_steps_lean(tiny_dirs, tmp_path) -> None:
    """Mistral 7B v0.2+ and Mistral Small set no sliding window: every layer attends its whole
    past (the tiny "mistral" has a window of 4, which the six steps above cross)."""
    tiny = _variant(tiny_dirs, tmp_path, "mistral", sliding_window=None)
    _assert_lean_matches(tiny)
    unit, status = DecodeUnit.build(tiny.spans[0], "auto")
    assert unit is not None and status.mode == "lean"


def test_gemma2_attention_logits_capped_as_transformers_caps_them(tiny_dirs, tmp_path) -> None:
    """Random tiny weights keep attention logits far under Gemma 2's cap of 50, where capping
    changes nothing; a cap of 0.05 over unscaled logits changes the logits by ~3e-2."""
    _assert_lean_matches(_variant(tiny_dirs, tmp_path, "gemma2", attn_logit_softcapping=0.05,
                                  query_pre_attn_scalar=1))  # fmt: skip


@pytest.mark.parametrize(
    "changes",
    [
        dict(multi_query=False, parallel_attn=False),  # query/key/value interleaved, in turn
        dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=2),  # 40B
        dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
    ],
)
def test_falcon_layouts_step_lean(changes, tiny_dirs, tmp_path) -> None:
    """The tiny "falcon" is Falcon 7B's layout (one key/value head, parallel attention);
    the others as Falcon 40B / 180B and the original RW models lay theirs out."""
    _assert_lean_matches(make_tiny("falcon", save_tiny("falcon", tmp_path / "falcon", **changes)))


@pytest.mark.parametrize("changes", [dict(rope_interleave=False), dict(q_lora_rank=None)])
def test_deepseek_layouts_step_lean(changes, tmp_path) -> None:
    """The tiny "deepseek_v3" is V3's layout (a low-rank query, interleaved rotary); DeepSeek-V2
    Lite projects its query at full rank, and some conversions de-interleave the rotary."""
    directory = save_tiny("deepseek_v3", tmp_path / "deepseek_v3", **changes)
    _assert_lean_matches(make_tiny("deepseek_v3", directory))


def test_deepseek_lean_steps_attend_latents_without_expanding_the_past(tiny_dirs) -> None:
    """transformers runs every cached latent through kv_b_proj at every step; the lean step
    attends the latents themselves (kv_b_proj's weights absorbed), so the module never runs."""
    span = make_tiny("deepseek_v3", tiny_dirs["deepseek_v3"]).spans[1]
    rows_seen: list[int] = []
    hooks = [layer.self_attn.kv_b_proj.register_forward_hook(
                 lambda _m, args, _out: rows_seen.append(args[0].shape[-2]))
             for layer in span.layers]  # fmt: skip
    decoder, session = LeanDecoder(span), span.new_session(batch_size=1, max_length=32)
    gen = torch.Generator().manual_seed(2)
    session.run(0, torch.randn(1, 6, 64, generator=gen))
    assert rows_seen  # the eager prefill expands its 6 tokens' latents
    rows_seen.clear()
    for _ in range(3):
        decoder.run([BatchStep(session, session.position, torch.randn(1, 1, 64, generator=gen))])
    for hook in hooks:
        hook.remove()
    assert rows_seen == [] and session.position == 9


def test_gemma4_and_quantized_spans_are_refused_and_stay_eager(tiny_dirs, tmp_path) -> None:
    """Gemma 4 (keys/values shared across layers, per-layer inputs) and int8 / nf4 spans are
    not covered: the server runs their decode steps eagerly."""
    span = ModelSpan.load(Checkpoint(save_tiny("gemma4_text", tmp_path / "g4")), 0, 3)
    assert "Gemma4TextDecoderLayer" in (refusal(span) or "")
    unit, status = DecodeUnit.build(span, "auto")
    assert unit is None and status.mode == "eager" and "not covered" in status.reason
    llama = ModelSpan.load(Checkpoint(tiny_dirs["llama"]), 0, 2)
    assert refusal(llama) is None
    assert refusal(llama, "nf4") == "nf4-quantized weights"
    unit, status = DecodeUnit.build(llama, "auto", "int8")
    assert unit is None and status.reason == "not covered: int8-quantized weights"


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs g++")
def test_compiled_parts_of_an_alibi_span_keep_its_biases(tiny_dirs) -> None:
    """`--compile on` compiles pre and post and keeps the rest of the span's parts: Bloom's
    steps then attend with its ALiBi biases (and ask for no rotary) as the eager path does."""
    span = ModelSpan.load(Checkpoint(tiny_dirs["bloom"]), 0, 4)
    unit, status = DecodeUnit.build(span, "on")
    assert unit is not None and status.mode == "compiled"
    unit.warm_up()
    gen = torch.Generator().manual_seed(3)
    lean, eager = (span.new_session(batch_size=1, max_length=32) for _ in range(2))
    x = torch.randn(1, 5, 64, generator=gen)
    lean.run(0, x)
    eager.run(0, x)
    for _ in range(4):
        y = torch.randn(1, 1, 64, generator=gen)
        got = unit.run([BatchStep(lean, lean.position, y)])[0]
        assert (got - eager.run(eager.position, y)[0]).abs().max() < 1e-5


def test_bloom_with_residuals_after_the_norms_steps_lean(tmp_path) -> None:
    """apply_residual_connection_post_layernorm: Bloom's attention and MLP add the normed
    input as their residual (the tiny "bloom" adds the input)."""
    directory = save_tiny(
        "bloom", tmp_path / "bloom", apply_residual_connection_post_layernorm=True
    )
    _assert_lean_matches(make_tiny("bloom", directory))


@pytest.mark.parametrize("pads", [{}, {2: 4}], ids=["plain", "padded"])
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "deepseek_v3", "bloom"])
def test_batched_sessions_of_other_lengths_equal_each_alone(family, pads, tiny_dirs) -> None:
    """Two sessions with different pasts in one lean step: each as its own eager step (gemma3:
    windows of 4 and two rotaries; bloom: ALiBi biases of each session's own positions); also
    with their 2 rows run as 4 (drift.models.rows: the zero rows are attended by nobody)."""
    span = make_tiny(family, tiny_dirs[family]).spans[1]
    gen = torch.Generator().manual_seed(0)
    lean, eager = [], []
    for past in (3, 9):
        x = torch.randn(1, past, 64, generator=gen)
        for group in (lean, eager):
            s = span.new_session(batch_size=1, max_length=32)
            s.run(0, x)
            group.append(s)
    decoder = LeanDecoder(span)
    decoder.row_pads = pads
    for _ in range(5):
        xs = [torch.randn(1, 1, 64, generator=gen) for _ in lean]
        got = decoder.run([BatchStep(s, s.position, x) for s, x in zip(lean, xs, strict=True)])
        for s, x, g in zip(eager, xs, got, strict=True):
            ref = s.run(s.position, x)[0]
            assert (g - ref).abs().max() < 1e-5
    assert [s.position for s in lean] == [8, 14]


@pytest.mark.parametrize("family", ["qwen3", "mistral", "deepseek_v3"])  # mistral: window 4
def test_rollback_reorder_and_eager_steps_between_lean_ones(family, tiny_dirs) -> None:
    """The lean step's preallocated keys stay the session's cache: a rollback, a beam reorder
    and an eager multi-token step in between leave it as exact as eager steps throughout."""
    span = make_tiny(family, tiny_dirs[family]).spans[0]
    decoder = LeanDecoder(span)
    gen = torch.Generator().manual_seed(1)
    a, b = (span.new_session(batch_size=2, max_length=40) for _ in range(2))
    x = torch.randn(2, 4, 64, generator=gen)
    a.run(0, x)
    b.run(0, x)

    def both(step_a, step_b) -> None:
        assert (step_a() - step_b()).abs().max() < 1e-5

    for _ in range(3):
        y = torch.randn(2, 1, 64, generator=gen)
        both(lambda y=y: decoder.run([BatchStep(a, a.position, y)])[0],
             lambda y=y: b.run(b.position, y)[0])  # fmt: skip
    y = torch.randn(2, 1, 64, generator=gen)
    both(lambda: decoder.run([BatchStep(a, 5, y)])[0], lambda: b.run(5, y)[0])  # rollback
    hypo = torch.tensor([1, 1])
    z = torch.randn(2, 1, 64, generator=gen)
    both(lambda: a.run(a.position, z, hypo_ids=hypo)[0],
         lambda: b.run(b.position, z, hypo_ids=hypo)[0])  # fmt: skip
    w = torch.randn(2, 3, 64, generator=gen)
    both(lambda: a.run(a.position, w)[0], lambda: b.run(b.position, w)[0])
    for _ in range(2):
        y = torch.randn(2, 1, 64, generator=gen)
        both(lambda y=y: decoder.run([BatchStep(a, a.position, y)])[0],
             lambda y=y: b.run(b.position, y)[0])  # fmt: skip
    assert a.position == b.position == 12


def test_bfloat16_lean_steps_within_bf16_tolerance(tiny_dirs) -> None:
    """bf16 spans' lean steps against transformers in bf16 (the full model, same weights)."""
    directory = tiny_dirs["llama"]
    ckpt = Checkpoint(directory)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    span = ModelSpan.load(ckpt, 0, 4, dtype=torch.bfloat16)
    head = ClientHead.load(ckpt, dtype=torch.bfloat16)
    decoder, session = LeanDecoder(span), span.new_session(batch_size=1, max_length=32)
    cache = DynamicCache(config=reference.config)
    ids = torch.tensor([[3, 17, 42, 99]])
    with torch.no_grad():
        session.run(0, head.embed(ids))
        ref = reference(input_ids=ids, cache=cache, use_cache=True).logits
        for _ in range(5):
            nxt = ref[:, -1].argmax(-1, keepdim=True)
            ref = reference(input_ids=nxt, cache=cache, use_cache=True).logits
            hidden = decoder.run([BatchStep(session, session.position, head.embed(nxt))])[0]
            got = head.logits(hidden)
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), ref.float(), atol=3e-2, rtol=2e-2)
    unit, status = DecodeUnit.build(span, "auto")  # measured slower lean on a CPU: eager
    assert unit is None and status.mode == "eager" and "half precision" in status.reason


@pytest.mark.slow
def test_smollm2_lean_greedy_steps_match_transformers(smollm2_cache) -> None:
    """The real SmolLM2-135M over 0:15 / 15:30: 20 greedy lean steps, transformers' tokens,
    logits within 1e-4 (the weights left as loaded, as `--compile auto` runs them)."""
    from transformers import LlamaForCausalLM

    from drift.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint("smollm2", cache_dir=smollm2_cache)
    reference = LlamaForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    spans = [ModelSpan.load(ckpt, 0, 15), ModelSpan.load(ckpt, 15, 30)]
    units = [DecodeUnit(span, compiled=False) for span in spans]
    assert all(unit.relaid == 0 for unit in units)  # the layout is --compile on's only
    head = ClientHead.load(ckpt)
    sessions = [span.new_session(batch_size=1, max_length=32) for span in spans]
    cache = DynamicCache(config=reference.config)
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    worst, ours, theirs = 0.0, [], []
    with torch.no_grad():
        hidden = head.embed(ids)
        for s in sessions:
            hidden = s.run(0, hidden)[0]
        ref = reference(input_ids=ids, cache=cache, use_cache=True).logits
        ours.append(int(head.logits(hidden)[0, -1].argmax()))
        theirs.append(int(ref[0, -1].argmax()))
        for _ in range(20):
            nxt = torch.tensor([[theirs[-1]]])
            ref = reference(input_ids=nxt, cache=cache, use_cache=True).logits
            hidden = head.embed(nxt)
            for s, unit in zip(sessions, units, strict=True):
                hidden = unit.run([BatchStep(s, s.position, hidden)])[0]
            got = head.logits(hidden)
            worst = max(worst, (got - ref).abs().max().item())
            ours.append(int(got[0, -1].argmax()))
            theirs.append(int(ref[0, -1].argmax()))
    assert ours == theirs
    assert worst < 1e-4, worst
