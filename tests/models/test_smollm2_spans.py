"""The real SmolLM2-135M (from its GGUF), split 0:15 / 15:30, agrees with transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

from drift.models.checkpoint import open_checkpoint
from drift.models.head import ClientHead
from drift.models.span import ModelSpan
from tests.models.span_checks import REAL_MODEL_CHECKS
from tests.models.tiny_spans import Tiny

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_cache) -> Tiny:
    ckpt = open_checkpoint("smollm2", cache_dir=smollm2_cache)
    reference = LlamaForCausalLM.from_pretrained(
        ckpt.path, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    spans = (ModelSpan.load(ckpt, 0, 15), ModelSpan.load(ckpt, 15, 30))
    return Tiny("smollm2", ckpt, reference, ClientHead.load(ckpt), spans, 15, batch_tol=1e-4)


def test_twenty_greedy_steps_match_transformers(smollm2: Tiny) -> None:
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])  # a short prompt in SmolLM2's vocab
    cache = DynamicCache(config=smollm2.reference.config)
    sessions = [span.new_session(batch_size=1, max_length=32) for span in smollm2.spans]
    worst = 0.0
    ours, theirs = [], []
    with torch.no_grad():
        for _ in range(21):  # the prompt, then 20 greedy tokens
            ref = smollm2.reference(input_ids=ids, cache=cache, use_cache=True).logits
            hidden = smollm2.head.embed(ids)
            for session in sessions:
                hidden = session.step(hidden)
            got = smollm2.head.logits(hidden)
            worst = max(worst, (got - ref).abs().max().item())
            ours.append(int(got[0, -1].argmax()))
            theirs.append(int(ref[0, -1].argmax()))
            ids = torch.tensor([[ours[-1]]])
    assert ours == theirs
    assert worst < 1e-4, worst


def test_two_block_span_holds_two_blocks_of_parameters(smollm2: Tiny) -> None:
    span = ModelSpan.load(smollm2.ckpt, 7, 9)
    per_block = sum(p.numel() for p in smollm2.reference.model.layers[0].parameters())
    assert span.num_parameters() == 2 * per_block
    all_blocks = sum(p.numel() for p in smollm2.reference.model.layers.parameters())
    assert span.num_parameters() / all_blocks == pytest.approx(2 / 30)


@pytest.mark.parametrize("check", REAL_MODEL_CHECKS, ids=lambda f: f.__name__)
def test_tiny_model_checks_hold_for_smollm2(check, smollm2: Tiny) -> None:
    check(smollm2)
