"""Stream a GGUF file's tensors into a safetensors file, one tensor in memory at a time.

Each tensor's bytes are read from the file (not mapped: read pages would stay resident),
shaped as the `gguf` package's reader shapes them and dequantized by it, passed through
transformers' own per-architecture GGUF processor (q/k un-permutation, norm offsets, expert
merging), renamed with transformers' own GGUF -> transformers name map, cast to the target
dtype and appended to the output: the steps of `from_pretrained(gguf_file=...)` without
holding the model. Knows nothing of caches, configs on disk or tokenizers.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from math import prod
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from .stream_write import StreamingSafetensors, header_room

log = logging.getLogger(__name__)
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")
CHUNK_BYTES = 4 << 20  # GGUF bytes dequantized at once


class _Entry(NamedTuple):
    name: str  # GGUF tensor name, e.g. blk.3.attn_q.weight
    ggml_type: int
    shape: tuple[int, ...]  # torch order (the reverse of ggml's)
    start: int  # absolute byte offset of the data in the file


def _tensor_table(gguf: Path) -> list[_Entry]:
    """Every tensor's name, type, shape and file offset, from the header alone."""
    from transformers.integrations.gguf.reader import GgufHeader

    try:  # reads the metadata without building the vocabulary: small and fast
        header = GgufHeader.from_file(str(gguf))
        return [_Entry(t.name, t.ggml_type, tuple(t.shape), header.data_start + t.offset)
                for t in header.tensors]  # fmt: skip
    except ValueError:  # a tensor type transformers' new reader does not know: gguf's reader
        from gguf import GGUFReader

        reader = GGUFReader(gguf)
        return [_Entry(t.name, int(t.tensor_type), tuple(reversed(t.shape.tolist())),
                       int(t.data_offset)) for t in reader.tensors]  # fmt: skip


def _read(f: Any, entry: _Entry) -> np.ndarray:
    """The tensor's bytes as `gguf.GGUFReader` presents them (typed values, or byte rows)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    qtype = GGMLQuantizationType(entry.ggml_type)
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
             GGMLQuantizationType.F64: np.float64}  # fmt: skip
    f.seek(entry.start)
    if qtype in plain:
        values = np.fromfile(f, dtype=plain[qtype], count=prod(entry.shape))
        return values.reshape(entry.shape)
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.fromfile(f, dtype=np.uint8, count=prod(entry.shape) * type_size // block)
    return raw.reshape(quant_shape_to_byte_shape(entry.shape, qtype))


def _dequantize(data: np.ndarray, ggml_type: int) -> np.ndarray:
    """gguf's dequantize, a few rows at a time: its numpy code makes several temporaries the
    size of its whole output, and blocks never straddle rows, so the values are the same."""
    from gguf import GGMLQuantizationType, dequantize

    qtype = GGMLQuantizationType(ggml_type)
    if data.ndim < 2 or data.nbytes <= CHUNK_BYTES:
        return dequantize(data, qtype)
    rows = data.reshape(-1, data.shape[-1])
    step = max(1, CHUNK_BYTES // rows[0].nbytes)
    first = dequantize(rows[:step], qtype)  # [step, in]
    out = np.empty((rows.shape[0], first.shape[-1]), dtype=first.dtype)
    out[:step] = first
    for i in range(step, rows.shape[0], step):
        out[i : i + step] = dequantize(rows[i : i + step], qtype)
    return out.reshape(*data.shape[:-1], first.shape[-1])


def _dequantized(gguf: Path, table: list[_Entry]) -> Iterator[tuple[_Entry, np.ndarray]]:
    with gguf.open("rb") as f:
        for entry in table:
            yield entry, _dequantize(_read(f, entry), entry.ggml_type)


def _block_of(gguf_name: str) -> int | None:
    match = _BLOCK.match(gguf_name)
    return int(match.group(1)) if match else None


def _name_map(config: Any, processor: Any) -> dict[str, str]:
    """GGUF tensor name -> transformers name, from a model built on `meta` (no weights)."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return get_gguf_hf_weights_map(model, processor)


def _as_tensor(weights: np.ndarray | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A dequantized array as a torch tensor of `dtype` (one copy at most)."""
    if isinstance(weights, torch.Tensor):
        return weights.to(dtype)
    array = np.asarray(weights, dtype=np.float32)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array).copy()  # a read-only view of the file's mmap
    return torch.from_numpy(array).to(dtype)


def write_gguf_tensors(gguf: Path, config: Any, parsed_config: dict, out: Path,
                       dtype: torch.dtype) -> int:  # fmt: skip
    """Write every tensor of `gguf` that the model has into the safetensors file `out`.

    `config`: the transformers config of the file; `parsed_config`: the raw config dict of
    transformers' GGUF parser (the processors read it). Returns the number of tensors written.
    """
    from transformers.integrations.gguf.reader import read_gguf_metadata
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    architecture = read_gguf_metadata(str(gguf))[0]["general.architecture"]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed_config)
    name_map = _name_map(config, processor)
    table = _tensor_table(gguf)
    remaining = Counter(_block_of(t.name) for t in table)
    # Processors that merge several GGUF tensors into one (MoE experts) write it here.
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}
    written = 0
    with StreamingSafetensors(out, header_room(sorted(set(name_map.values())))) as writer:
        for info, weights in _dequantized(gguf, table):  # weights: float32, e.g. [out, in]
            result = processor.process(weights=weights, name=info.name,
                                       tensor_key_mapping=name_map, parsed_parameters=parsed)  # fmt: skip
            if result.name in name_map:
                writer.add(name_map[result.name], _as_tensor(result.weights, dtype))
                written += 1
            del weights, result
            block = _block_of(info.name)
            remaining[block] -= 1
            if remaining[block] == 0:  # every GGUF tensor of this block seen: merges are whole
                written += _flush(parsed["tensors"], writer, dtype, block)
        written += _flush(parsed["tensors"], writer, dtype, None, everything=True)
    return written


def _flush(pending: dict[str, torch.Tensor], writer: StreamingSafetensors, dtype: torch.dtype,
           block: int | None, *, everything: bool = False) -> int:  # fmt: skip
    """Write (and drop) the merged tensors of layer `block` (all of them with `everything`)."""
    done = []
    for name in list(pending):
        match = _LAYER.search(name)
        if everything or (match is not None and int(match.group(1)) == block):
            writer.add(name, pending.pop(name).to(dtype))
            done.append(name)
    return len(done)
