"""Names to torch devices and dtypes: `pick_device` and `parse_dtype`.

Pure lookups with clear errors; nothing here reads the environment or loads weights.
"""

from __future__ import annotations

import torch

from drift.wire.errors import BadRequest

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
DEVICE_NAMES = ("auto", "cpu", "cuda", "xpu", "mps")


def _available(kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    backend = getattr(torch, kind, None) if kind == "xpu" else getattr(torch.backends, kind, None)
    return bool(backend is not None and backend.is_available())


def pick_device(name: str = "auto") -> torch.device:
    """`auto` picks cuda, then xpu, then mps, then cpu; an explicit name must be available."""
    kind = name.split(":", 1)[0].strip().lower()
    if kind not in DEVICE_NAMES:
        raise BadRequest(f"unknown device {name!r}; use one of {', '.join(DEVICE_NAMES)}")
    if kind == "auto":
        for candidate in ("cuda", "xpu", "mps"):
            if _available(candidate):
                return torch.device(candidate)
        return torch.device("cpu")
    if not _available(kind):
        raise BadRequest(f"device {name!r} is not available on this machine")
    return torch.device(name.strip().lower())


def parse_dtype(name: str | torch.dtype, device: torch.device | None = None) -> torch.dtype:
    """float32/fp32, float16/fp16, bfloat16/bf16, or auto (bfloat16 on accelerators, float32 on cpu)."""
    if isinstance(name, torch.dtype):
        if name not in _DTYPES.values():
            raise BadRequest(f"unsupported dtype {name}; use float32, float16 or bfloat16")
        return name
    key = str(name).strip().lower().removeprefix("torch.")
    if key == "auto":
        return torch.float32 if device is None or device.type == "cpu" else torch.bfloat16
    if key not in _DTYPES:
        raise BadRequest(f"unknown dtype {name!r}; use float32, float16, bfloat16 or auto")
    return _DTYPES[key]
