"""Fixtures for server tests: a tiny llama checkpoint and a factory of real servers."""

from __future__ import annotations

import pytest

from tests.server.harness import RunningServer, start_block_server
from tests.tiny_models import save_tiny


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture
async def servers():
    """`await servers(model_dir, start, end, **config)`; all stopped at teardown."""
    started: list[RunningServer] = []

    async def start(model_dir, start_block, end_block, **overrides):
        running = await start_block_server(model_dir, start_block, end_block, **overrides)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.stop()
