"""The docs stay true: every block of README.md and docs/*.md marked `<!-- run: ... -->` runs
against real loopback servers (a SmolLM2 block server and `drift api` on it), and a broken
documented command fails this test. Blocks marked `slow` run only without `-m "not slow"`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.docs_blocks import REPO, Block, Live, all_blocks, drift_commands, parse, run_block
from tests.procs import DriftProc

pytestmark = pytest.mark.timeout(900)

BLOCKS = all_blocks()


def _param(block: Block):
    marks = [pytest.mark.slow] if block.slow else []
    return pytest.param(block, id=block.where, marks=marks)


def test_the_docs_mark_their_runnable_blocks() -> None:
    """The quickstart, the SDK, the API and a node's routes each have a block that runs."""
    wheres = {b.where.split(":")[0]: b for b in BLOCKS}
    assert {"README.md", "docs/api.md"} <= set(wheres), sorted(wheres)
    langs = {(b.env, b.lang) for b in BLOCKS}
    assert {("node", "bash"), ("api", "bash"), ("api", "python"), ("node", "python")} <= langs


def test_a_marker_not_before_a_block_is_refused(tmp_path: Path) -> None:
    page = REPO / "docs" / "_broken_marker_test.md"  # parse() names files relative to REPO
    try:
        page.write_text("<!-- run: node -->\ntext\n```bash\ndrift --help\n```\n")
        with pytest.raises(ValueError, match="not right before"):
            parse(page)
        page.write_text("<!-- run: nowhere -->\n```bash\ndrift --help\n```\n")
        with pytest.raises(ValueError, match="unreadable run marker"):
            parse(page)
    finally:
        page.unlink()


@pytest.fixture(scope="module")
def live(smollm2_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A plain-HTTP SmolLM2 server of every block and `drift api smollm2` on it, loopback."""
    import os

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cache = str(tmp_path_factory.mktemp("docs-cache"))
    started: list[DriftProc] = []
    try:
        node = DriftProc(["server", "smollm2", "--block_indices", "0:30", "--host", "127.0.0.1",
                          "--port", "0", "--plain_http", "--throughput", "100", "--device", "cpu",
                          "--torch_dtype", "float32", "--cache_dir", str(smollm2_cache)], env)  # fmt: skip
        started.append(node)
        token = node.wait_for(r"join token: (drift://\S+)", timeout=300).group(1)
        port = re.search(r"@127\.0\.0\.1:(\d+)", token).group(1)  # type: ignore[union-attr]
        api = DriftProc(["api", "smollm2", "--initial_peers", token, "--host", "127.0.0.1",
                         "--port", "0", "--api_key", "sk-drift", "--cache_dir", cache], env)  # fmt: skip
        started.append(api)
        api_url = api.wait_for(r"on (http://127\.0\.0\.1:\d+)/v1", timeout=300).group(1)
        yield Live(token, f"http://127.0.0.1:{port}", api_url, smollm2_cache)
    finally:
        for proc in started:
            proc.kill()


@pytest.mark.slow  # a real SmolLM2 server (the demo weights package)
@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_documented_block_runs(block: Block, live: Live, tmp_path: Path) -> None:
    run_block(block, live, tmp_path)


@pytest.mark.slow
def test_a_broken_documented_command_fails(live: Live, tmp_path: Path) -> None:
    """The runner is not a rubber stamp: a block whose command is wrong, or whose output
    lacks what its marker expects, or shows an error body, fails."""
    (good,) = [b for b in BLOCKS if b.where.startswith("README.md") and b.env == "node"
               and b.lang == "bash"]  # fmt: skip
    broken = Block(good.where, good.env, good.lang, good.code.replace("--max_new_tokens",
                   "--max_tokens"), False, False, ())  # fmt: skip
    with pytest.raises(AssertionError, match="documented block failed"):
        run_block(broken, live, tmp_path)
    curl = f"curl -s {live.node_url}/forward -d '{{\"start_block\": 0}}'"
    with pytest.raises(AssertionError, match="an error body"):
        run_block(Block("x", "node", "bash", curl, False, False, ()), live, tmp_path)
    with pytest.raises(AssertionError, match="lacks"):
        run_block(Block("x", "node", "bash", "echo hi", False, False, ("bye",)), live, tmp_path)


def _parse_error(command: str) -> str | None:
    """The real parser's complaint about one documented command line (None: it parses)."""
    import contextlib
    import io
    import shlex

    from drift.cli.main import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exc:
        return err.getvalue().strip() or f"exit {exc.code}" if exc.code else None
    return None


def test_every_documented_drift_command_parses() -> None:
    """Also the blocks that need other machines: each `drift ...` line parses with the real
    CLI (docs/cli.md is generated, so it is left out)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    commands = [c for p in pages if p.name != "cli.md" for c in drift_commands(p)]
    assert len(commands) >= 15
    bad = [(where, cmd, err) for where, cmd in commands if (err := _parse_error(cmd))]
    assert not bad, "documented commands the CLI refuses:\n" + "\n".join(map(str, bad))
    assert _parse_error("drift up smollm2 --max_tokens 8") is not None  # a broken one fails
