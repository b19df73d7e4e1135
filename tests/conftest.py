"""Shared test configuration: tests run on the CPU, deterministic, float32 by default."""

from __future__ import annotations

import os
import shutil
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# huggingface_hub reads HF_HOME when first imported, which sub-directory conftests do before
# any hook runs: so here, at import. Tests never touch the user's Hugging Face cache.
HF_HOME = tempfile.mkdtemp(prefix="drift-test-hf-")
os.environ["HF_HOME"] = HF_HOME
os.environ.pop("HF_HUB_CACHE", None)


def pytest_configure(config) -> None:
    """Tests (and the processes they start) never touch the user's ~/.cache/drift."""
    config._drift_cache = tempfile.TemporaryDirectory(prefix="drift-test-cache-")
    os.environ["DRIFT_CACHE"] = config._drift_cache.name


def pytest_unconfigure(config) -> None:
    cache = getattr(config, "_drift_cache", None)
    if cache is not None:
        cache.cleanup()
    shutil.rmtree(HF_HOME, ignore_errors=True)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    """A DRIFT cache dir holding SmolLM2-135M-Instruct converted (float32, what CPU servers and
    clients run) from its GGUF, once per run.

    Pass it as `cache_dir=` (or DRIFT_CACHE for subprocesses) so later opens skip conversion.
    """
    import torch

    from drift.models.checkpoint import open_checkpoint

    cache = tmp_path_factory.mktemp("drift-cache-smollm2")
    open_checkpoint("smollm2", cache_dir=cache, dtype=torch.float32)
    return cache


@pytest.fixture(scope="session")
def gemma3_cache(tmp_path_factory):
    """A DRIFT cache dir holding Gemma 3 270M assembled and converted (float32) from its GGUF,
    once per run.

    The directory is fresh, so this first open is the conversion (~40-90 s on a small CPU);
    tests that open "gemma3-270m" with `cache_dir=` it reuse the conversion.
    """
    import torch

    from drift.models.checkpoint import open_checkpoint

    cache = tmp_path_factory.mktemp("drift-cache-gemma3")
    open_checkpoint("gemma3-270m", cache_dir=cache, dtype=torch.float32)
    return cache
