"""Checkpoint over local safetensors directories: lazy reads, fingerprints, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from drift.models.checkpoint import (
    Checkpoint,
    config_fingerprint,
    default_cache_dir,
    open_checkpoint,
)
from drift.wire.errors import BadRequest, NotFound
from tests.tiny_models import build_tiny, save_tiny


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sharded")
    build_tiny("llama").save_pretrained(directory, max_shard_size="60KB")
    assert (directory / "model.safetensors.index.json").is_file()
    return directory


def _state_dict(family: str = "llama") -> dict[str, torch.Tensor]:
    return build_tiny(family).state_dict()


def test_single_file_reads_layer_by_prefix(llama_dir: Path) -> None:
    ckpt = open_checkpoint(str(llama_dir))
    assert isinstance(ckpt, Checkpoint)
    assert ckpt.name == llama_dir.name and ckpt.path == llama_dir.resolve()
    assert ckpt.config.model_type == "llama" and ckpt.config.num_hidden_layers == 4
    layer = ckpt.tensors("model.layers.1.")
    expected = {
        k[len("model.layers.1.") :]: v
        for k, v in _state_dict().items()
        if k.startswith("model.layers.1.")
    }
    assert sorted(layer) == sorted(expected) and len(layer) == 9
    for key, value in expected.items():
        assert torch.equal(layer[key], value), key
    assert "model.embed_tokens.weight" in ckpt.tensor_names()
    assert ckpt.tensors("no.such.prefix.") == {}


def test_sharded_reads_only_needed_shards(sharded_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "copy"
    shutil.copytree(sharded_dir, directory)
    ckpt = open_checkpoint(directory)
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) >= 3
    wanted = {weight_map[n] for n in weight_map if n.startswith("model.layers.2.")}
    # Destroy every other shard after opening: reading layer 2 must not touch them.
    for shard in set(weight_map.values()) - wanted:
        (directory / shard).write_bytes(b"garbage")
    layer = ckpt.tensors("model.layers.2.")
    reference = _state_dict()
    assert len(layer) == 9
    for key, value in layer.items():
        assert torch.equal(value, reference["model.layers.2." + key]), key


def test_sharded_equals_single(llama_dir: Path, sharded_dir: Path) -> None:
    single, sharded = open_checkpoint(llama_dir), open_checkpoint(sharded_dir)
    assert single.tensor_names() == sharded.tensor_names()
    a, b = single.tensors("model."), sharded.tensors("model.")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_config_leaves_attn_implementation_to_adapter(llama_dir: Path) -> None:
    ckpt = open_checkpoint(llama_dir)
    assert ckpt.config._attn_implementation is None


def test_fingerprint_architecture_only(llama_dir: Path, tmp_path: Path) -> None:
    base = open_checkpoint(llama_dir).fingerprint
    assert len(base) == 64 and int(base, 16) >= 0
    # Same architecture under another name and dtype label: same fingerprint.
    same = tmp_path / "same"
    shutil.copytree(llama_dir, same)
    config = json.loads((same / "config.json").read_text())
    config["dtype"] = "bfloat16"
    config["transformers_version"] = "0.0.0"
    (same / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(same).fingerprint == base
    # One architecture field changed: another fingerprint.
    other = tmp_path / "other"
    shutil.copytree(llama_dir, other)
    config["rms_norm_eps"] = 1e-3
    (other / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(other).fingerprint != base
    # A known revision is part of it.
    cfg = open_checkpoint(llama_dir).config
    assert config_fingerprint(cfg) == base
    assert config_fingerprint(cfg, "abc123") != base


def test_fingerprint_differs_across_families(tmp_path: Path) -> None:
    fps = {open_checkpoint(save_tiny(f, tmp_path / f)).fingerprint for f in ("llama", "qwen2")}
    assert len(fps) == 2


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        open_checkpoint(str(tmp_path / "nope"))


def test_dir_without_config(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(NotFound, match="no config.json"):
        open_checkpoint(tmp_path)


def test_dir_without_weights(llama_dir: Path, tmp_path: Path) -> None:
    shutil.copy(llama_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(NotFound, match="no safetensors weights"):
        open_checkpoint(tmp_path)


def test_pickle_weights_refused(llama_dir: Path, tmp_path: Path) -> None:
    shutil.copy(llama_dir / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(BadRequest, match="pickle"):
        open_checkpoint(tmp_path)


def test_missing_shard_named(sharded_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "copy"
    shutil.copytree(sharded_dir, directory)
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(NotFound, match=shard.name):
        open_checkpoint(directory)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(llama_dir: Path, tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "copy"
    shutil.copytree(llama_dir, directory)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"\x00garbage" * 10 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(BadRequest, match="corrupt safetensors file .*model.safetensors"):
        open_checkpoint(directory)


def test_default_cache_dir_reads_env_at_call_time(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DRIFT_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DRIFT_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "drift"


def test_converted_dir_keeps_its_recorded_revision(llama_dir: Path, tmp_path: Path) -> None:
    """A GGUF conversion records its source; opened by path it keeps that revision."""
    converted = tmp_path / "converted"
    shutil.copytree(llama_dir, converted)
    plain = open_checkpoint(converted, cache_dir=tmp_path)
    (converted / "drift_source.json").write_text(
        json.dumps({"gguf_file": "x.gguf", "size": 1, "revision": "gguf-sha256:abc"})
    )
    recorded = open_checkpoint(converted, cache_dir=tmp_path)
    assert plain.revision is None and recorded.revision == "gguf-sha256:abc"
    assert recorded.fingerprint != plain.fingerprint
    assert open_checkpoint(converted, cache_dir=tmp_path, revision="v2").revision == "v2"
