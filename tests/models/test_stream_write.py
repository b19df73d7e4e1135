"""The streaming safetensors writer: files safetensors reads back exactly, clear limits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from drift.models.sources.stream_write import StreamingSafetensors, header_room


def test_round_trip_of_every_dtype_and_shape(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(7, 5, generator=gen),
        "a.bf16": torch.randn(3, 3, generator=gen).to(torch.bfloat16),  # odd byte count: 18
        "b.f16": torch.randn(11, generator=gen).to(torch.float16),
        "c.scalar": torch.tensor(3.5),
        "d.ints": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "e.empty": torch.zeros(0, 4),
        "f.noncontiguous": torch.randn(4, 6, generator=gen).t(),
    }
    path = tmp_path / "model.safetensors"
    with StreamingSafetensors(path, header_room(list(tensors))) as out:
        for name, tensor in tensors.items():
            out.add(name, tensor)
    loaded = load_file(path)
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(str(path), framework="pt") as f:  # the reader DRIFT's spans use
        assert f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_tensor("a.bf16"), tensors["a.bf16"])


def test_header_must_fit_the_room_reserved(tmp_path: Path) -> None:
    out = StreamingSafetensors(tmp_path / "x.safetensors", header_room(["a"]))
    for i in range(20):
        out.add(f"tensor.{i}.with.a.long.name", torch.zeros(1))
    with pytest.raises(ValueError, match="exceeds the .* reserved"):
        out.close()


def test_a_name_twice_is_refused(tmp_path: Path) -> None:
    with StreamingSafetensors(tmp_path / "x.safetensors", header_room(["a"])) as out:
        out.add("a", torch.zeros(2))
        with pytest.raises(ValueError, match="written twice"):
            out.add("a", torch.zeros(2))
