"""The code blocks of README.md and docs/*.md marked to run, and how one is run.

A block runs when the line before its fence is `<!-- run: ENV [slow] [errors-ok]
[expect: TEXT]... -->` (docs/internals.md, "Tests"). ENV names what it runs against: `node`
(a plain-HTTP block server of SmolLM2 on loopback) or `api` (`drift api` on that node).
Addresses and tokens written in the docs are replaced by the live ones; bash blocks run with
`drift` meaning this checkout's CLI, python blocks in a fresh interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVS = ("node", "api")
MARKED = re.compile(r"^<!-- run: (?P<spec>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<code>.*?)^```$",
                    re.S | re.M)  # fmt: skip
TOKEN = re.compile(r"drift://12D3KooW\.\.\.@[\w.]+:31337")
NODE_URL = "http://127.0.0.1:31337"
API_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Block:
    """One marked block: where it is, what it needs, what its output must show."""

    where: str  # "docs/api.md:120"
    env: str  # one of ENVS
    lang: str  # bash | python
    code: str
    slow: bool
    errors_ok: bool  # its output may hold an error body (it shows one on purpose)
    expect: tuple[str, ...]  # texts its output must contain


@dataclass(frozen=True)
class Live:
    """The servers a block runs against: the join token, the node's URL, the API's URL."""

    token: str
    node_url: str
    api_url: str | None
    cache: Path  # the blocks' DRIFT_CACHE (SmolLM2 converted there once)


def parse(path: Path) -> list[Block]:
    """The marked blocks of one Markdown file; ValueError on a marker it cannot read."""
    text = path.read_text()
    out = []
    for m in MARKED.finditer(text):
        where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
        head, *expects = m.group("spec").split(" expect: ")
        words = head.split()
        if not words or words[0] not in ENVS or set(words[1:]) - {"slow", "errors-ok"}:
            raise ValueError(f"{where}: unreadable run marker {m.group('spec')!r}")
        if m.group("lang") not in ("bash", "python"):
            raise ValueError(f"{where}: a run marker on a {m.group('lang')} block")
        out.append(Block(where, words[0], m.group("lang"), m.group("code"), "slow" in words,
                         "errors-ok" in words, tuple(e.strip() for e in expects)))  # fmt: skip
    if len(re.findall(r"^<!-- run:", text, re.M)) != len(out):
        raise ValueError(f"{path}: a run marker that is not right before a fenced block")
    return out


def all_blocks() -> list[Block]:
    return [b for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
            for b in parse(p)]  # fmt: skip


def substituted(code: str, live: Live) -> str:
    code = TOKEN.sub(live.token, code).replace(NODE_URL, live.node_url)
    return code.replace(API_URL, live.api_url) if live.api_url else code


def shim_dir(folder: Path) -> Path:
    """A folder whose `drift` is this checkout's CLI run by this interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "drift"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m drift.cli "$@"\n')
    shim.chmod(0o755)
    return folder


def run_block(block: Block, live: Live, scratch: Path, timeout_s: float = 240) -> str:
    """Run one block; AssertionError naming it when it fails or misses an expected text."""
    code = substituted(block.code, live)
    (scratch / "home").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               DRIFT_CACHE=str(live.cache), HOME=str(scratch / "home"),
               PATH=f"{shim_dir(scratch / 'bin')}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    argv = (["bash", "-euo", "pipefail", "-c", code] if block.lang == "bash"
            else [sys.executable, "-c", code])  # fmt: skip
    proc = subprocess.run(argv, env=env, cwd=scratch, capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    shown = f"{block.where} ({block.lang}, exit {proc.returncode}):\n{code}\n--- output\n" \
            f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"  # fmt: skip
    assert proc.returncode == 0, f"documented block failed: {shown}"
    missing = [e for e in block.expect if e not in proc.stdout]
    assert not missing, f"documented block's output lacks {missing}: {shown}"
    if not block.errors_ok:
        assert '{"error"' not in proc.stdout.replace(" ", ""), f"an error body: {shown}"
    return proc.stdout


def drift_commands(path: Path) -> list[tuple[str, str]]:
    """Every `drift ...` command in a fenced block of one page: (where, command), comments,
    redirections and the commands chained with it left out."""
    out, inside = [], False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if raw.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        for part in re.split(r"&&|\|\||;|\|", raw.split(" #")[0]):
            part = re.split(r"\s>\s?", part.strip())[0]
            if part.startswith("drift "):
                out.append((f"{path.relative_to(REPO)}:{number}", part))
    return out
