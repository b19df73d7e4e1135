"""Fixtures for client tests: tiny checkpoints, swarms of real block servers on loopback
(tests/client/swarms.py) and SDK models opened on them, all stopped and closed at teardown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from drift.models.checkpoint import open_checkpoint
from tests.client.swarms import SdkModels, Swarms  # noqa: F401  (types of the root fixtures)
from tests.tiny_models import TinyDirs


@pytest.fixture
def swarm_model(swarms: Swarms, sdk_models: SdkModels):
    """`await swarm_model(model_dir, spans, **from_pretrained_kw)` -> (swarm, model): a swarm
    and a causal LM (or `cls=`) opened on its seed; both end with the fixtures above."""

    async def start(model_dir: Path, spans: list[tuple[int, int]], **kwargs: Any):
        swarm = await swarms.start(model_dir, spans)
        return swarm, await sdk_models.open(model_dir, swarm.token, **kwargs)

    return start


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> TinyDirs:
    return TinyDirs(tmp_path_factory.mktemp("tiny_client"))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted (float32) from its GGUF into a checkpoint dir, once per
    run."""
    import torch

    cache = tmp_path_factory.mktemp("client-smollm2")
    return Path(open_checkpoint("smollm2", cache_dir=cache, dtype=torch.float32).path)
