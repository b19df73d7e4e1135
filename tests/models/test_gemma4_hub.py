"""Hub shard selection for Gemma 4's multimodal checkpoint: text layers by their
`model.language_model.layers.N.` names, client pieces (with the per-layer embeddings), and
never a shard that holds only the vision or audio tower."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from drift.models.checkpoint import open_checkpoint
from drift.models.head import ClientHead
from drift.models.sources.hub import is_text, layer_of, select_shards
from drift.models.span import ModelSpan
from tests.models.hub_cache import hub_cache
from tests.tiny_models import build_tiny

V, A, T1, T2 = "vision.safetensors", "audio.safetensors", "text-1.safetensors", "text-2.safetensors"
WEIGHT_MAP = {
    "model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight": V,
    "model.embed_vision.embedding_projection.weight": V,
    "model.audio_tower.layers.0.self_attn.q_proj.linear.weight": A,
    "model.embed_audio.embedding_projection.weight": A,
    "model.language_model.embed_tokens.weight": T1,
    "model.language_model.embed_tokens_per_layer.weight": T1,
    "model.language_model.per_layer_model_projection.weight": T1,
    "model.language_model.layers.0.mlp.up_proj.weight": T1,
    "model.language_model.layers.1.mlp.up_proj.weight": T2,
    "model.language_model.norm.weight": T2,
}


def test_names_of_the_text_tower() -> None:
    assert layer_of("model.language_model.layers.7.self_attn.q_proj.weight") == 7
    assert layer_of("model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight") is None
    assert layer_of("model.audio_tower.layers.3.lconv1d.linear_start.linear.weight") is None
    assert not is_text("model.embed_vision.embedding_projection.weight")
    assert is_text("model.language_model.embed_tokens_per_layer.weight")
    assert select_shards(WEIGHT_MAP, range(0)) == []  # a client: its reads fetch its shards
    assert select_shards(WEIGHT_MAP, range(1, 2)) == [T2]  # block 1's shard only
    assert select_shards(WEIGHT_MAP, None) == [T1, T2]  # the whole model: its text tower


def test_partial_hub_snapshot_of_the_multimodal_checkpoint(tmp_path: Path) -> None:
    files = tmp_path / "files"
    model = build_tiny("gemma4")
    model.save_pretrained(files, max_shard_size="40KB")
    snapshot = hub_cache("org/gemma4-tiny", files)
    weight_map = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    client = {n for n in weight_map if is_text(n) and layer_of(n) is None}  # what a client reads
    keep = set(select_shards(weight_map, range(2, 4))) | {weight_map[n] for n in client}
    media_only = {s for s in weight_map.values()} - {s for n, s in weight_map.items() if is_text(n)}
    assert media_only and not keep & media_only  # the towers have shards of their own: skipped
    for shard in set(weight_map.values()) - keep:  # a partial fetch: the rest never arrived
        (snapshot / shard).unlink()
    ckpt = open_checkpoint("org/gemma4-tiny", cache_dir=tmp_path, blocks=range(2, 4))
    span, head = ModelSpan.load(ckpt, 2, 4), ClientHead.load(ckpt)
    state = model.state_dict()
    for i in (2, 3):
        for name, value in span.layers[i - 2].state_dict().items():
            assert torch.equal(value, state[f"model.language_model.layers.{i}.{name}"]), name
    table = state["model.language_model.embed_tokens_per_layer.weight"]
    assert head.per_layer is not None
    assert torch.equal(head.per_layer.embed_tokens_per_layer.weight, table)
