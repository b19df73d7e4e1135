"""Fixtures for the drop-in tests: tiny checkpoints, swarms of real servers on loopback served
from a background thread (tests/compat/background.py), models opened on them.

Tests adapted from Petals keep Petals' module globals (MODEL_NAME, REF_NAME, INITIAL_PEERS,
ADAPTER_NAME, placeholders there) and Petals' own fixtures; `petals_globals` fills the
globals for each test with a fresh swarm, as Petals' test_utils reads them from the
environment. A module's FAMILIES (default llama) parametrizes every test in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.swarms import Swarm
from tests.compat.background import BackgroundSwarms
from tests.tiny_models import TinyDirs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "family" in metafunc.fixturenames:
        metafunc.parametrize("family", getattr(metafunc.module, "FAMILIES", ("llama",)))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> TinyDirs:
    return TinyDirs(tmp_path_factory.mktemp("tiny_compat"))


@pytest.fixture
def model_dir(tiny_dirs: TinyDirs, family: str) -> Path:
    return tiny_dirs(family)


@pytest.fixture
def bg_swarms() -> Iterator[BackgroundSwarms]:
    """`bg_swarms.start(model_dir, spans)`: every server started is stopped at teardown."""
    swarms = BackgroundSwarms()
    try:
        yield swarms
    finally:
        swarms.stop_all()


@pytest.fixture
def swarm(bg_swarms: BackgroundSwarms, model_dir: Path) -> Swarm:
    """Two servers splitting the model's blocks: [0, 2) and [2, n)."""
    from transformers import AutoConfig

    n = AutoConfig.from_pretrained(model_dir).num_hidden_layers
    return bg_swarms.start(model_dir, [(0, 2), (2, n)])


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """A list for the models a test opens; each is closed at teardown."""
    models: list[Any] = []
    yield models
    for model in models:
        model.close()


@pytest.fixture
def dist_model(swarm: Swarm, model_dir: Path, opened: list[Any]) -> Any:
    from drift.client import AutoDistributedModelForCausalLM

    model = AutoDistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.token)
    opened.append(model)
    return model


@pytest.fixture
def local_model(model_dir: Path) -> Any:
    from tests.server.reference import load_reference

    return load_reference(model_dir)


@pytest.fixture
def tokenizer() -> Any:
    from tests.compat.tiny_tokenizer import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(autouse=True)
def petals_globals(request: pytest.FixtureRequest, monkeypatch, family: str) -> None:
    """MODEL_NAME / REF_NAME (the tiny checkpoint) and INITIAL_PEERS (a fresh swarm's join
    token) for modules adapted from Petals."""
    module = request.module
    if not hasattr(module, "MODEL_NAME"):
        return
    swarm = request.getfixturevalue("swarm")
    model_dir = str(request.getfixturevalue("model_dir"))
    monkeypatch.setattr(module, "MODEL_NAME", model_dir)
    monkeypatch.setattr(module, "REF_NAME", model_dir)
    monkeypatch.setattr(module, "INITIAL_PEERS", [swarm.token])
