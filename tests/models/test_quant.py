"""Quantized spans (bitsandbytes int8 / nf4): what is quantized, what it costs, how close it is.

Tolerances are relative L2 errors of the logits against the same span in float32, measured on
the tiny random llama (README, "Quantization"): int8 0.011, nf4 0.18 (random 64-wide weights
are nf4's worst case); SmolLM2's: test_smollm2_logits_close_to_float32.
"""

from __future__ import annotations

import sys

import pytest
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.head import ClientHead
from drift.models.quant import Int8Linear, block_bytes, parse_quant, storage_bytes
from drift.models.registry import get_adapter
from drift.models.span import ModelSpan
from drift.wire.errors import BadRequest
from tests.tiny_models import FAMILIES

pytest.importorskip("bitsandbytes")

# Largest relative L2 logit error vs float32 allowed on the tiny llama (measured 0.011 / 0.18).
TINY_TOL = {"int8": 0.04, "nf4": 0.3}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def _ids(batch: int = 2, tokens: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _logits(head: ClientHead, span: ModelSpan, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return head.logits(span(head.embed(ids)))


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_tiny_llama_logits_close_to_float32(tiny_dirs, quant: str) -> None:
    ckpt = Checkpoint(tiny_dirs["llama"])
    head = ClientHead.load(ckpt)
    ids = _ids()
    want = _logits(head, ModelSpan.load(ckpt, 0, 4), ids)
    span = ModelSpan.load(ckpt, 0, 4, quant=quant)
    error = _rel(_logits(head, span, ids), want)
    print(f"\ntiny llama {quant}: relative logit error {error:.4f}")
    assert 0 < error < TINY_TOL[quant]  # > 0: the weights really are quantized
    assert span.quant == quant


@pytest.mark.parametrize("quant", ["int8", "nf4"])
@pytest.mark.parametrize("family", FAMILIES)
def test_block_bytes_equal_what_a_loaded_block_holds(tiny_dirs, family: str, quant: str) -> None:
    ckpt = Checkpoint(tiny_dirs[family])
    adapter = get_adapter(ckpt.config)
    n = adapter.num_layers
    for dtype in (torch.float32, torch.bfloat16):
        span = ModelSpan.load(ckpt, 0, n, dtype=dtype, quant=quant)
        with torch.no_grad():  # int8 moves its scales into the matmul state on the first call
            span(torch.randn(1, 3, adapter.hidden_size))
        for i, layer in enumerate(span.layers):
            expected = block_bytes(adapter.build_layer(i), dtype, quant)
            assert storage_bytes(layer) == expected, (family, quant, dtype, i)
        plain = sum(block_bytes(adapter.build_layer(i), dtype, "none") for i in range(n))
        assert sum(storage_bytes(layer) for layer in span.layers) < plain


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "falcon"])
def test_only_linear_weights_are_quantized(tiny_dirs, family: str) -> None:
    import bitsandbytes as bnb

    ckpt = Checkpoint(tiny_dirs[family])
    span = ModelSpan.load(ckpt, 0, ckpt.config.num_hidden_layers, quant="nf4")
    quantized = [m for m in span.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized
    for name, module in span.named_modules():
        if isinstance(module, torch.nn.Linear) and not isinstance(module, bnb.nn.Linear4bit):
            assert name.rsplit(".", 1)[-1] in ("gate", "router"), name  # a router, left alone
    for name, param in span.named_parameters():
        if not any(param is m.weight for m in quantized):
            assert param.dtype == torch.float32, name  # norms, routers, fused experts


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_quantized_session_matches_stateless_run(tiny_dirs, quant: str) -> None:
    ckpt = Checkpoint(tiny_dirs["llama"])
    head = ClientHead.load(ckpt)
    span = ModelSpan.load(ckpt, 0, 4, quant=quant)
    ids = _ids(1, 8, seed=3)
    session = span.new_session(batch_size=1, max_length=16)
    with torch.no_grad():
        steps = [head.logits(session.step(head.embed(ids[:, :5])))[:, -1]]
        steps += [head.logits(session.step(head.embed(ids[:, i : i + 1])))[:, -1]
                  for i in range(5, 8)]  # fmt: skip
        full = _logits(head, span, ids)
    for k, got in enumerate(steps):
        # int8 quantizes activations per call (with outlier columns of the whole call)
        assert _rel(got, full[:, 4 + k]) < (0.02 if quant == "int8" else 1e-5)


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_backward_through_a_quantized_span(tiny_dirs, quant: str) -> None:
    ckpt = Checkpoint(tiny_dirs["llama"])
    hidden = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    grad_out = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(2))
    want, _ = ModelSpan.load(ckpt, 1, 3).backward(hidden, grad_out)
    got, _ = ModelSpan.load(ckpt, 1, 3, quant=quant).backward(hidden, grad_out)
    assert torch.isfinite(got).all()
    assert 0 < _rel(got, want) < TINY_TOL[quant]


def test_int8_takes_inputs_of_any_rank(tiny_dirs) -> None:
    """DeepSeek's latent attention calls kv_b_proj on rank-4 tensors."""
    ckpt = Checkpoint(tiny_dirs["deepseek_v3"])
    span = ModelSpan.load(ckpt, 0, 4, quant="int8")
    assert any(isinstance(m, Int8Linear) for m in span.modules())
    with torch.no_grad():
        assert torch.isfinite(span(torch.randn(1, 4, 64))).all()


def test_missing_bitsandbytes_is_a_clear_error(tiny_dirs, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import raises ImportError
    with pytest.raises(BadRequest, match=r"pip install 'drift-swarm\[quant\]'"):
        ModelSpan.load(Checkpoint(tiny_dirs["llama"]), 0, 2, quant="nf4")
    ModelSpan.load(Checkpoint(tiny_dirs["llama"]), 0, 2, quant="none")  # needs nothing


def test_parse_quant(tiny_dirs) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert parse_quant("auto", cpu) == "none" and parse_quant("auto", cuda) == "nf4"
    assert parse_quant("INT8", cpu) == "int8" and parse_quant("none", cuda) == "none"
    with pytest.raises(BadRequest, match="unknown quantization 'int4'; use auto, none, int8, nf4"):
        parse_quant("int4", cpu)
    with pytest.raises(BadRequest, match="unknown quantization"):
        ModelSpan.load(Checkpoint(tiny_dirs["llama"]), 0, 1, quant="fp8")


# Measured on SmolLM2-135M (README): relative L2 logit error / top-1 agreement over the chat
# prompt's positions. Its weights are Q4_1 already, so nf4 quantizes a 4-bit grid again.
SMOLLM2_TOL = {"int8": (0.08, 0.95), "nf4": (0.7, 0.45)}  # measured 0.044 / 0.98, 0.59 / 0.52


@pytest.mark.slow
def test_smollm2_logits_close_to_float32(smollm2_cache) -> None:
    from transformers import AutoTokenizer

    from drift.cli.generate import encode_prompt
    from drift.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint("smollm2", cache_dir=smollm2_cache, dtype=torch.float32)
    head = ClientHead.load(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt.path)
    ids = encode_prompt(tokenizer, "What is the capital of France? Answer in one sentence.")
    want = _logits(head, ModelSpan.load(ckpt, 0, 30), ids)
    for quant, (max_error, min_top1) in SMOLLM2_TOL.items():
        got = _logits(head, ModelSpan.load(ckpt, 0, 30, quant=quant), ids)
        error = _rel(got, want)
        top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        print(f"\nSmolLM2 {quant}: relative logit error {error:.4f}, top-1 agreement {top1:.3f}")
        assert 0 < error < max_error and top1 >= min_top1, quant


@pytest.mark.parametrize("shape", [(64, 128), (129, 192), (37, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nf4_in_chunks_gives_bitsandbytes_own_bytes(shape, dtype) -> None:
    """quantize_nf4_in_chunks (a chunk of weights at a time, so loading a big projection on
    the CPU holds one chunk's float32 temporaries) against Params4bit quantizing the whole
    weight on its move: the same packed bytes, scales, second-level state and dequantized
    weights; odd sizes and a remainder block included."""
    import bitsandbytes as bnb

    from drift.models.quant import NF4_BLOCK, quantize_nf4_in_chunks

    torch.manual_seed(0)
    w = torch.randn(shape, dtype=torch.float32).to(dtype) * 0.05

    def param() -> torch.nn.Parameter:
        return bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type="nf4",
                                 blocksize=NF4_BLOCK, compress_statistics=True)  # fmt: skip

    whole = param().to("cpu")
    for chunk in (NF4_BLOCK, 3 * NF4_BLOCK, 1 << 20):
        mine = param()
        quantize_nf4_in_chunks(bnb, mine, chunk=chunk)
        a, b = whole.quant_state, mine.quant_state
        assert mine.bnb_quantized and torch.equal(mine.data, whole.data)
        assert torch.equal(a.absmax, b.absmax) and torch.equal(a.offset, b.offset)
        assert torch.equal(a.state2.absmax, b.state2.absmax)
        assert torch.equal(a.state2.code, b.state2.code) and torch.equal(a.code, b.code)
        assert (a.shape, a.dtype, a.blocksize, a.quant_type) == (b.shape, b.dtype, b.blocksize,
                                                                 b.quant_type)  # fmt: skip
        assert torch.equal(bnb.functional.dequantize_4bit(mine.data, b),
                           bnb.functional.dequantize_4bit(whole.data, a))  # fmt: skip
