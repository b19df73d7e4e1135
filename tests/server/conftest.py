"""Fixtures for server tests: a tiny llama checkpoint (real servers: `servers` in
tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.tiny_models import save_tiny


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("tiny") / "llama")
