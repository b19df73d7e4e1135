"""uv.lock is in sync with pyproject.toml (`uv lock --check`), and pyproject chooses the torch
build the way uv documents: `cpu` / `cuda` extras, conflicting, mapped to PyTorch's indexes.

`uv lock --check` needs every index pyproject names; where one cannot be reached (no network,
or no route to download.pytorch.org) the check is skipped, naming the index.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def uv_command() -> list[str] | None:
    if shutil.which("uv"):
        return ["uv"]
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    return None


def test_torch_build_is_chosen_by_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert any(r.startswith("torch") for r in extras["cpu"])
    assert any(r.startswith("torch") for r in extras["cuda"])
    uv = project["tool"]["uv"]
    assert [{"extra": "cpu"}, {"extra": "cuda"}] in uv["conflicts"]
    indexes = {i["name"]: i for i in uv["index"]}
    by_extra = {s["extra"]: indexes[s["index"]] for s in uv["sources"]["torch"]}
    assert by_extra["cpu"]["url"] == "https://download.pytorch.org/whl/cpu"
    assert by_extra["cuda"]["url"].startswith("https://download.pytorch.org/whl/cu")
    assert all(i.get("explicit") for i in by_extra.values()), "only torch from PyTorch's index"


def test_lock_is_in_sync_with_pyproject() -> None:
    uv = uv_command()
    if uv is None:
        pytest.skip("uv is not installed (pip install uv)")
    proc = subprocess.run([*uv, "lock", "--check"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    out = proc.stdout + proc.stderr
    unreachable = re.search(r"Failed to fetch:\s+(\S+)", out)
    if proc.returncode != 0 and unreachable and re.search(r"dns error|Connect|timed out", out):
        pytest.skip(f"uv lock --check needs {unreachable.group(1)}, unreachable from here")
    assert proc.returncode == 0, f"uv.lock is out of date: run `uv lock`\n{out[-3000:]}"
