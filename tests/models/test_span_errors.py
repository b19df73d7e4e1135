"""Bad input gets a clear error naming the problem; dtypes and device names resolve."""

from __future__ import annotations

import pytest
import torch

from drift.models.checkpoint import Checkpoint
from drift.models.devices import parse_dtype, pick_device
from drift.models.head import ClientHead
from drift.models.registry import get_adapter, supported_model_types
from drift.models.span import ModelSpan
from drift.wire.errors import BadRequest, BadTensor, LengthExceeded, SpanNotServed
from tests.models.tiny_spans import make_tiny


@pytest.fixture(scope="module")
def llama(tiny_dirs):
    return make_tiny("llama", tiny_dirs["llama"])


def test_supported_types_and_unknown_type() -> None:
    types = supported_model_types()
    for t in (
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "mixtral",
        "qwen3_moe",
        "gemma2",
        "gemma3_text",
        "deepseek_v3",
        "falcon",
        "bloom",
    ):
        assert t in types

    class Config:
        model_type = "gpt2"

    with pytest.raises(BadRequest, match="unsupported model_type 'gpt2'.*llama"):
        get_adapter(Config())


def test_load_span_out_of_range(llama) -> None:
    for start, end in ((0, 5), (-1, 2), (2, 2), (3, 1)):
        with pytest.raises(BadRequest, match="outside the model's 4 blocks"):
            ModelSpan.load(llama.ckpt, start, end)
    with pytest.raises(BadRequest, match="dtype"):
        ModelSpan.load(llama.ckpt, 0, 1, dtype=torch.float64)


def test_sub_span_out_of_range(llama) -> None:
    span = llama.spans[1]  # [2, 4)
    hidden = torch.zeros(1, 2, 64)
    with pytest.raises(SpanNotServed, match=r"\[1, 4\).*\[2, 4\)"):
        span(hidden, start_block=1)
    with pytest.raises(SpanNotServed):
        span.new_session(batch_size=1, max_length=4, end_block=5)


def test_bad_hidden_states(llama) -> None:
    span = llama.spans[0]
    with pytest.raises(BadTensor, match="hidden size 32, this model's is 64"):
        span(torch.zeros(1, 2, 32))
    with pytest.raises(BadTensor, match="rank 3"):
        span(torch.zeros(2, 64))
    with pytest.raises(BadTensor, match="floating point"):
        span(torch.zeros(1, 2, 64, dtype=torch.long))
    with pytest.raises(BadTensor, match="attention_mask has shape"):
        span(torch.zeros(1, 2, 64), attention_mask=torch.ones(1, 3))
    with pytest.raises(BadTensor, match="only 0"):
        span(torch.zeros(1, 2, 64), attention_mask=torch.full((1, 2), 2))
    with pytest.raises(BadTensor, match="prompts cover 1 blocks, the span has 2"):
        span(torch.zeros(1, 2, 64), prompts=torch.zeros(1, 1, 2, 64))  # span has 2 blocks
    with pytest.raises(BadTensor, match="grad_outputs has shape"):
        span.backward(torch.zeros(1, 2, 64), torch.zeros(1, 3, 64))


def test_session_errors_leave_the_session_usable(llama) -> None:
    span = llama.spans[0]
    session = span.new_session(batch_size=2, max_length=4)
    hidden = torch.randn(2, 3, 64)
    first = session.step(hidden)
    with pytest.raises(LengthExceeded, match="max_length 4"):
        session.step(torch.randn(2, 2, 64))
    with pytest.raises(LengthExceeded, match="position 5"):
        session.step(torch.randn(2, 1, 64), position=5)
    with pytest.raises(BadTensor, match="batch size is 2"):
        session.step(torch.randn(1, 1, 64))
    with pytest.raises(BadTensor, match="hypo_ids values must lie"):
        session.step(torch.randn(2, 1, 64), hypo_ids=torch.tensor([0, 2]))
    with pytest.raises(BadTensor, match="hidden size"):
        session.step(torch.randn(2, 1, 8))
    assert session.position == 3
    again = session.step(hidden, position=0)  # rollback to 0 replays the prompt
    torch.testing.assert_close(again, first, atol=1e-6, rtol=0)
    with pytest.raises(BadRequest, match=">= 1"):
        span.new_session(batch_size=0, max_length=4)
    session.close()
    with pytest.raises(BadRequest, match="closed"):
        session.step(hidden)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_spans_keep_the_callers_dtype(llama, dtype) -> None:
    span = ModelSpan.load(llama.ckpt, 0, 2, dtype=dtype)
    assert all(p.dtype == dtype for p in span.parameters())
    hidden = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(11))
    ref = llama.spans[0](hidden)
    out = span(hidden)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=0.1, rtol=0.05)
    session = span.new_session(batch_size=1, max_length=8)
    stepped = session.step(hidden.to(torch.float16))
    assert stepped.dtype == torch.float16
    grad, _ = span.backward(hidden, torch.ones_like(hidden))
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all()


def test_client_head_loads_only_its_tensors(llama) -> None:
    head = llama.head
    names = {n for n, _ in head.named_parameters()}
    assert names == {"embed_tokens.weight", "norm.weight", "lm_head.weight"}
    with pytest.raises(BadTensor, match="input_ids must lie"):
        head.embed(torch.tensor([[0, 256]]))


def test_client_head_tied_embeddings(tiny_dirs) -> None:
    ckpt = Checkpoint(tiny_dirs["bloom"])
    assert ckpt.config.tie_word_embeddings and "lm_head.weight" not in ckpt.tensor_names()
    head = ClientHead.load(ckpt)
    assert head.lm_head.weight is head.embed_tokens.weight


def test_devices_and_dtypes() -> None:
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda", "xpu", "mps")
    with pytest.raises(BadRequest, match="unknown device 'tpu'"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BadRequest, match="not available"):
            pick_device("cuda")
    assert parse_dtype("fp32") is torch.float32
    assert parse_dtype("float16") is torch.float16
    assert parse_dtype("bfloat16") is torch.bfloat16
    assert parse_dtype("auto", torch.device("cpu")) is torch.float32
    assert parse_dtype("auto", torch.device("cuda")) is torch.bfloat16
    with pytest.raises(BadRequest, match="unknown dtype 'int8'"):
        parse_dtype("int8")
