"""Fixtures for span tests: tiny checkpoints of every family and their full HF models
(built by tests/models/tiny_spans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.models.tiny_spans import Tiny, make_tiny
from tests.tiny_models import FAMILIES, save_tiny


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {family: save_tiny(family, root / family) for family in FAMILIES}


_CACHE: dict[str, Tiny] = {}


@pytest.fixture(params=FAMILIES)
def tiny(request, tiny_dirs) -> Tiny:
    family = request.param
    if family not in _CACHE:
        _CACHE[family] = make_tiny(family, tiny_dirs[family])
    return _CACHE[family]
