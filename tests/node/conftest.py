"""Fixtures for node tests: a factory of real nodes on loopback, all stopped at teardown."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.node.node_helpers import Nodes


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    started = Nodes()
    try:
        yield started
    finally:
        await started.stop_all()
