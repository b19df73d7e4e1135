"""The real Gemma 3 270M (from its GGUF), split 0:6 / 6:18 across a full/sliding boundary.

Layer types repeat (5 sliding, 1 full): layer 5 is the first full layer, so both spans hold
both kinds, each with its own rotary (local base for sliding, global for full layers).
Checked against transformers' Gemma3ForCausalLM on the same converted weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, DynamicCache, Gemma3ForCausalLM

from drift.models.batch import BatchStep
from drift.models.checkpoint import Checkpoint, open_checkpoint
from drift.models.head import ClientHead
from drift.models.registry import get_adapter
from drift.models.span import ModelSpan
from drift.models.static_step import LeanDecoder
from tests.models.span_checks import REAL_MODEL_CHECKS
from tests.models.tiny_spans import Tiny

pytestmark = pytest.mark.slow

SPLIT = 6
PROMPT = (
    "The lighthouse keeper climbed the narrow stairs every evening, lit the great lamp, "
    "and watched the ships pass slowly through the cold grey fog until"
)
SMALL_WINDOW = 16  # < prompt + 20 steps, so sliding layers must drop their oldest tokens


def _load(directory: Path, ckpt: Checkpoint) -> Tiny:
    adapter = get_adapter(ckpt.config)
    reference = Gemma3ForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation=adapter.attn_implementation
    ).eval()
    n = adapter.num_layers
    spans = (ModelSpan.load(ckpt, 0, SPLIT), ModelSpan.load(ckpt, SPLIT, n))
    # batch_tol 5e-4: the shared checks feed ids < 256 (Gemma's control/unused tokens), whose
    # logits reach |137|; float32 reduction-order noise between a padded batch and a row alone
    # is then ~5e-6 relative. transformers itself, padded batch with cache vs each row alone,
    # differs by up to 3.3e-4; our sessions equal its padded batch exactly (a test below).
    return Tiny("gemma3_text", ckpt, reference, ClientHead.load(ckpt), spans, SPLIT, 5e-4)


@pytest.fixture(scope="module")
def gemma3(gemma3_cache) -> Tiny:
    ckpt = open_checkpoint("gemma3-270m", cache_dir=gemma3_cache)
    return _load(ckpt.path, ckpt)


@pytest.fixture(scope="module")
def prompt_ids(gemma3: Tiny) -> torch.Tensor:
    ids = AutoTokenizer.from_pretrained(gemma3.ckpt.path)(PROMPT, return_tensors="pt").input_ids
    assert 25 <= ids.shape[1] <= 40, ids.shape
    return ids


def _greedy(model: Tiny, ids: torch.Tensor, steps: int = 20,
            lean: bool = False) -> tuple[list, list, float]:  # fmt: skip
    """The prompt then `steps` greedy tokens: spans with sessions vs the full model with cache;
    with `lean`, the decode steps run on the servers' lean step (drift.models.static_step)."""
    cache = DynamicCache(config=model.reference.config)
    length = ids.shape[1] + steps
    sessions = [span.new_session(batch_size=1, max_length=length) for span in model.spans]
    decoders = [LeanDecoder(span) for span in model.spans]
    ours, theirs, worst = [], [], 0.0
    with torch.no_grad():
        for _ in range(steps + 1):
            ref = model.reference(input_ids=ids, cache=cache, use_cache=True).logits
            hidden = model.head.embed(ids)
            for session, decoder in zip(sessions, decoders, strict=True):
                if lean and ids.shape[1] == 1:
                    hidden = decoder.run([BatchStep(session, session.position, hidden)])[0]
                else:
                    hidden = session.step(hidden)
            got = model.head.logits(hidden)
            worst = max(worst, (got - ref).abs().max().item())
            ours.append(int(got[0, -1].argmax()))
            theirs.append(int(ref[0, -1].argmax()))
            ids = torch.tensor([[ours[-1]]])
    assert [s.position for s in sessions] == [length] * 2
    return ours, theirs, worst


def test_split_cuts_a_full_sliding_boundary(gemma3: Tiny) -> None:
    types = gemma3.reference.config.layer_types
    assert gemma3.num_layers == 18 and len(types) == 18
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [5, 11, 17]
    assert types[SPLIT - 1] == "full_attention" and types[SPLIT] == "sliding_attention"
    assert gemma3.reference.config.sliding_window == 512
    assert [(s.start_block, s.end_block) for s in gemma3.spans] == [(0, SPLIT), (SPLIT, 18)]


def test_client_head_scales_embeddings_like_gemma(gemma3: Tiny) -> None:
    ids = torch.tensor([[2, 818, 5279, 529, 7001, 563]])
    with torch.no_grad():
        ours = gemma3.head.embed(ids)
        theirs = gemma3.reference.model.embed_tokens(ids)
        raw = torch.nn.functional.embedding(ids, gemma3.head.embed_tokens.weight)
    assert gemma3.head.embed_scale == pytest.approx(640**0.5)
    assert torch.equal(ours, theirs)
    assert not torch.allclose(ours, raw)  # the scale is applied, not left to the servers


@pytest.mark.parametrize("lean", [False, True], ids=["eager", "lean"])
def test_twenty_greedy_steps_match_transformers(gemma3: Tiny, prompt_ids, lean) -> None:
    ours, theirs, worst = _greedy(gemma3, prompt_ids, lean=lean)
    print(f"\ngemma3 greedy: worst logit diff {worst:.2e}, tokens {ours}")
    assert ours == theirs
    assert worst < 1e-4, worst
    assert len(set(ours)) > 3  # a real continuation, not one token repeated


@pytest.mark.parametrize("lean", [False, True], ids=["eager", "lean"])
def test_greedy_steps_past_a_small_sliding_window(gemma3: Tiny, prompt_ids, tmp_path,
                                                  lean) -> None:  # fmt: skip
    """The real window (512) is never reached in a short test; same weights, window 16."""
    directory = tmp_path / "gemma3-window16"
    directory.mkdir()
    config = json.loads((gemma3.ckpt.path / "config.json").read_text())
    assert config["sliding_window"] == 512
    config["sliding_window"] = SMALL_WINDOW
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").symlink_to(gemma3.ckpt.path / "model.safetensors")
    small = _load(directory, Checkpoint(directory))
    assert small.reference.config.sliding_window == SMALL_WINDOW
    assert prompt_ids.shape[1] + 20 > 2 * SMALL_WINDOW
    ours, theirs, worst = _greedy(small, prompt_ids, lean=lean)
    print(f"\ngemma3 window {SMALL_WINDOW}: worst logit diff {worst:.2e}, tokens {ours}")
    assert ours == theirs
    assert worst < 1e-4, worst
    # The window matters: with it, the same prompt's last logits differ from the real model's.
    with torch.no_grad():
        narrow = small.reference(input_ids=prompt_ids).logits[0, -1]
        wide = gemma3.reference(input_ids=prompt_ids).logits[0, -1]
    assert (narrow - wide).abs().max() > 1e-2


def test_padded_batch_sessions_match_transformers_padded_batch(gemma3: Tiny, prompt_ids) -> None:
    """Left-padded rows of different lengths, prompt then 5 steps: the same batch through
    transformers (2D mask, positions from its cumsum, one cache) gives the same logits."""
    rows = [prompt_ids[0], prompt_ids[0, 7:], prompt_ids[0, 15:27]]
    width = max(len(r) for r in rows)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :], mask[i, width - len(row) :] = row, 1
    cache = DynamicCache(config=gemma3.reference.config)
    sessions = [span.new_session(batch_size=3, max_length=width + 5) for span in gemma3.spans]
    worst, kwargs = 0.0, {"attention_mask": mask}
    with torch.no_grad():
        for _ in range(6):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
            ref = gemma3.reference(
                input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache
            ).logits[:, -1]
            hidden = gemma3.head.embed(ids)
            for session in sessions:
                hidden = session.step(hidden, **kwargs)
            got = gemma3.head.logits(hidden)[:, -1]
            worst = max(worst, (got - ref).abs().max().item())
            assert torch.equal(got.argmax(-1), ref.argmax(-1))
            ids, kwargs = got.argmax(-1, keepdim=True), {}
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
    assert worst < 1e-5, worst


@pytest.mark.parametrize("check", REAL_MODEL_CHECKS, ids=lambda f: f.__name__)
def test_tiny_model_checks_hold_for_gemma3(check, gemma3: Tiny) -> None:
    check(gemma3)
