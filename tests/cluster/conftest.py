"""Fixtures for the cluster-in-a-box tests: skipped, with the reason, where no box can be built."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.box import why_not

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


@pytest.fixture(scope="session")
def box_model(tmp_path_factory) -> Path:
    """A 12-block float32 checkpoint (~0.4 GiB, 26.5 MiB a block) bigger than a box machine."""
    import torch
    from make_model import make_model

    return make_model("box-llama", tmp_path_factory.mktemp("box-llama"), dtype=torch.float32)


@pytest.fixture
def box_ok() -> Iterator[None]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    yield
