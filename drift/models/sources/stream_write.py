"""Write a safetensors file one tensor at a time, holding none of the others in memory.

The header goes first in the format, so `StreamingSafetensors` reserves room for it (the
caller bounds the tensor names up front), appends each tensor's bytes as it comes, and writes
the header into the reserved room at the end, padded with spaces as the format allows.
Knows nothing of GGUF or models.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import torch

_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
ENTRY_BYTES = 160  # header bytes one entry needs besides its name (dtype, shape, offsets)


def header_room(names: list[str], max_dims: int = 4) -> int:
    """Bytes to reserve for the header of a file holding at most these tensor names."""
    per_dim = 21  # digits of an int64 and a comma
    room = 64 + sum(len(json.dumps(n)) + ENTRY_BYTES + per_dim * max_dims for n in names)
    return -(-room // 8) * 8


class StreamingSafetensors:
    """`with StreamingSafetensors(path, room) as out: out.add(name, tensor) ...`"""

    def __init__(self, path: Path, room: int) -> None:
        self.path = Path(path)
        self.room = -(-room // 8) * 8  # the data starts 8-aligned
        self._entries: dict[str, dict[str, object]] = {}
        self._offset = 0
        self._file: BinaryIO = self.path.open("wb")
        self._file.write(b"\0" * (8 + self.room))

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Append one tensor (any device; copied to the CPU, contiguous) under `name`."""
        if name in self._entries:
            raise ValueError(f"tensor {name!r} written twice")
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} has unsupported dtype {tensor.dtype}")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():
            self._file.write(flat.view(torch.uint8).numpy().data)
        size = flat.numel() * flat.element_size()
        self._entries[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [self._offset, self._offset + size],
        }
        self._offset += size

    def close(self) -> None:
        """Write the header into its reserved room; ValueError if it does not fit."""
        if self._file.closed:
            return
        header = json.dumps(
            {"__metadata__": {"format": "pt"}, **self._entries}, separators=(",", ":")
        ).encode()
        try:
            if len(header) > self.room:
                raise ValueError(
                    f"safetensors header of {len(header)} bytes exceeds the {self.room} reserved"
                )
            self._file.seek(0)
            self._file.write(struct.pack("<Q", self.room))
            self._file.write(header + b" " * (self.room - len(header)))
        finally:
            self._file.close()

    def __enter__(self) -> StreamingSafetensors:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:
            self._file.close()
