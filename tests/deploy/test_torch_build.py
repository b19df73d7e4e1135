"""The installed torch is the build that was asked for: `DRIFT_TORCH_BUILD=cpu` (e.g. after
`uv pip install --torch-backend=cpu -e ".[dev]"`) means a CPU build and no CUDA package at
all; `cuda` means a CUDA build. Skipped when nothing was asked for."""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch

ASKED = os.environ.get("DRIFT_TORCH_BUILD", "").strip().lower()


@pytest.mark.skipif(not ASKED, reason="set DRIFT_TORCH_BUILD=cpu|cuda to check the torch build")
def test_installed_torch_is_the_build_asked_for() -> None:
    nvidia = sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                    if (d.metadata["Name"] or "").lower().startswith("nvidia-"))  # fmt: skip
    if ASKED == "cpu":
        assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
        assert not nvidia, f"CUDA packages installed: {nvidia}"
    elif ASKED == "cuda":
        assert torch.version.cuda is not None, f"torch {torch.__version__} is not a CUDA build"
    else:
        pytest.fail(f"DRIFT_TORCH_BUILD={ASKED!r}: expected cpu or cuda")
