"""Shared test configuration: tests run on the CPU, deterministic, float32 by default."""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config) -> None:
    """Tests (and the processes they start) never touch the user's ~/.cache/drift."""
    import tempfile

    config._drift_cache = tempfile.TemporaryDirectory(prefix="drift-test-cache-")
    os.environ["DRIFT_CACHE"] = config._drift_cache.name


def pytest_unconfigure(config) -> None:
    cache = getattr(config, "_drift_cache", None)
    if cache is not None:
        cache.cleanup()


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A DRIFT cache dir holding SmolLM2-135M-Instruct converted from its GGUF, once per run.

    Pass it as `cache_dir=` (or DRIFT_CACHE for subprocesses) so later opens skip conversion.
    """
    from drift.models.checkpoint import open_checkpoint

    cache = tmp_path_factory.mktemp("drift-cache-smollm2")
    open_checkpoint("smollm2", cache_dir=cache)
    return cache


@pytest.fixture(scope="session")
def gemma3_cache(tmp_path_factory):
    """A DRIFT cache dir holding Gemma 3 270M assembled and converted from its GGUF, once per run.

    The directory is fresh, so this first open is the conversion (~40-90 s on a small CPU);
    tests that open "gemma3-270m" with `cache_dir=` it reuse the conversion.
    """
    from drift.models.checkpoint import open_checkpoint

    cache = tmp_path_factory.mktemp("drift-cache-gemma3")
    open_checkpoint("gemma3-270m", cache_dir=cache)
    return cache
