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


@pytest.fixture
async def nodes():
    """`await nodes.start(*seeds, **node_config)`: membership nodes on 127.0.0.1
    (tests/node/node_helpers.py); every node started is stopped at teardown."""
    from tests.node.node_helpers import Nodes

    started = Nodes()
    try:
        yield started
    finally:
        await started.stop_all()


@pytest.fixture
async def servers():
    """`await servers(model_dir, start, end, **config)`: real block servers on 127.0.0.1
    (tests/server/harness.py); every server started is stopped at teardown."""
    from tests.server.harness import RunningServer, start_block_server

    started: list[RunningServer] = []

    async def start(model_dir, start_block, end_block, **overrides):
        running = await start_block_server(model_dir, start_block, end_block, **overrides)
        started.append(running)
        return running

    try:
        yield start
    finally:
        while started:
            await started.pop().stop()


@pytest.fixture
def drift_procs():
    """A list for the `drift` processes (tests/procs.py DriftProc) a test starts; each is
    killed at teardown."""
    started: list = []
    yield started
    for proc in started:
        proc.kill()


@pytest.fixture
def popens():
    """A list for the subprocess.Popen processes a test starts; each still running is
    killed, and every one reaped, at teardown."""
    started: list = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
async def swarms():
    """`await swarms.start(model_dir, spans, swarm_key=None, **server_config)` -> Swarm;
    every server of every swarm started is stopped at teardown, also when the test fails."""
    from tests.client.swarms import Swarms

    started = Swarms()
    try:
        yield started
    finally:
        await started.stop_all()


@pytest.fixture
async def sdk_models(swarms):
    """`await sdk_models.open(name_or_dir, initial_peers, cls=..., **kw)` -> model, opened in
    a thread; all closed at teardown, before `swarms` stops their servers."""
    from tests.client.swarms import SdkModels

    opened = SdkModels()
    try:
        yield opened
    finally:
        await opened.close_all()


@pytest.fixture
async def web_apps(sdk_models):
    """`await web_apps.start(app)` -> base URL of an aiohttp app on 127.0.0.1 (e.g. `drift
    api`'s); every app started is cleaned up at teardown, before the SDK models it may use
    are closed and their swarms stopped."""
    from tests.api.apps import AppRunners

    started = AppRunners()
    try:
        yield started
    finally:
        await started.cleanup_all()


@pytest.fixture
def two_threads():
    """torch on 2 threads on the test's thread (restored after), whatever this machine's
    default: thread counts chosen by timing (drift.models.threads) have two to choose from."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
