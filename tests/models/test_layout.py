"""drift.models.layout: the text tower found from tensor names, canonical names mapped, and
the error for a truly missing tensor naming the prefixes tried. Plus what reads through it:
a checkpoint's head and blocks, the client parts' names and the Hub shard selection."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from drift.models.checkpoint import Checkpoint
from drift.models.client_files import client_tensor_names
from drift.models.head import ClientHead
from drift.models.layout import TOWERS, TextLayout
from drift.models.sources.hub import select_shards
from drift.models.span import ModelSpan
from drift.wire.errors import BadRequest
from tests.multimodal_models import save_multimodal

TEXT_ONLY = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
             "model.norm.weight", "lm_head.weight"]  # fmt: skip
NEW = ["model.language_model.embed_tokens.weight", "model.language_model.layers.0.mlp.w",
       "model.vision_tower.encoder.layers.0.mlp.w", "model.language_model.norm.weight",
       "lm_head.weight"]  # fmt: skip
OLD = ["language_model.model.embed_tokens.weight", "language_model.model.layers.0.mlp.w",
       "vision_tower.encoder.layers.0.mlp.w", "multi_modal_projector.linear.weight",
       "language_model.lm_head.weight"]  # fmt: skip


@pytest.mark.parametrize(
    ("names", "tower", "head"),
    [
        (TEXT_ONLY, "model.", "lm_head."),
        (NEW, "model.language_model.", "lm_head."),
        (OLD, "language_model.model.", "language_model.lm_head."),
        (OLD[:1] + OLD[-1:], "language_model.model.", "language_model.lm_head."),  # parts only
        (["transformer.h.0.mlp.w", "transformer.ln_f.weight"], "model.", "lm_head."),  # bloom
    ],
)
def test_the_tower_is_found_from_the_names(names, tower, head):
    layout = TextLayout.find(names)
    assert (layout.tower, layout.head) == (tower, head)
    assert layout.stored("model.layers.3.") == tower + "layers.3."
    assert layout.stored("lm_head.weight") == head + "weight"
    assert layout.stored("transformer.h.0.") == "transformer.h.0."  # not under a tower


def test_only_the_text_tower_and_head_are_text():
    layout = TextLayout.find(OLD)
    assert [n for n in OLD if layout.is_text(n)] == [OLD[0], OLD[1], OLD[4]]
    assert all(TextLayout.find(TEXT_ONLY).is_text(n) for n in TEXT_ONLY)


def test_an_older_save_s_vision_layers_are_not_blocks():
    weight_map = {OLD[0]: "a", OLD[1]: "b", OLD[2]: "c", OLD[3]: "d", OLD[4]: "a"}
    assert select_shards(weight_map, range(0, 1)) == ["b"]
    assert select_shards(weight_map, None) == ["a", "b"]


def test_the_missing_message_names_every_prefix_tried():
    message = TextLayout.find(NEW).missing("model.embed_tokens_per_layer.weight")
    assert "'model.language_model.embed_tokens_per_layer.weight'" in message
    assert all(t in message for t in TOWERS)


def test_a_checkpoint_lacking_a_client_tensor_says_where_it_looked(tmp_path):
    directory = save_multimodal("gemma4", tmp_path / "g4")
    weights = load_file(directory / "model.safetensors")
    del weights["model.language_model.embed_tokens_per_layer.weight"]
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    ckpt = Checkpoint(directory)
    ModelSpan.load(ckpt, 0, 2)  # its blocks are all there
    with pytest.raises(BadRequest) as caught:
        ClientHead.load(ckpt)
    assert "model.language_model.embed_tokens_per_layer.weight" in str(caught.value)
    assert all(t in str(caught.value) for t in TOWERS)


def test_a_block_truly_missing_says_where_it_looked(tmp_path):
    directory = save_multimodal("gemma3", tmp_path / "g3")
    weights = load_file(directory / "model.safetensors")
    weights = {n: t for n, t in weights.items() if ".layers.1." not in n or "vision" in n}
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadRequest) as caught:
        ModelSpan.load(Checkpoint(directory), 0, 2)
    message = str(caught.value)
    assert "block 1" in message and "'language_model.model.layers.1.'" in message
    assert all(t in message for t in TOWERS)


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "mistral3"])
def test_client_parts_are_the_text_tower_s_tensors_as_stored(tmp_path, family):
    ckpt = Checkpoint(save_multimodal(family, tmp_path / family))
    names = client_tensor_names(ckpt)
    assert names and all(n.startswith((ckpt.layout.tower, ckpt.layout.head)) for n in names)
    assert ckpt.layout.stored("model.embed_tokens.weight") in names
    assert not any(".layers." in n for n in names)
