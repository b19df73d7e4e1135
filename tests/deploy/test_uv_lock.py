"""uv.lock is in sync with pyproject.toml and resolves from PyPI alone, checked offline.

Two checks, so that a stale lock fails wherever the tests run: `lock_drift` compares
pyproject's requirements with what the lock recorded of them (its `requires-dist`; needs
nothing but the two files), and `uv lock --check --offline` (where uv is installed: the dev
extra brings it) re-resolves against the lock without a network. Both are also run on a
deliberately stale copy, which must fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.deploy.install_helpers import uv_command

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PYPI = "https://pypi.org/simple"
Key = tuple[str, str, SpecifierSet]  # name, extra ("" for the core), specifier


def wanted(pyproject: dict) -> set[Key]:
    project = pyproject["project"]
    groups = {"": project.get("dependencies", []), **project.get("optional-dependencies", {})}
    out: set[Key] = set()
    for extra, reqs in groups.items():
        for text in reqs:
            req = Requirement(text)
            out.add((canonicalize_name(req.name), extra, req.specifier))
    return out


def locked(lock: dict, name: str) -> tuple[set[Key], list[str]]:
    (pkg,) = [p for p in lock["package"] if p["name"] == name]
    out: set[Key] = set()
    for dep in pkg["metadata"]["requires-dist"]:
        extra = re.search(r"extra == '([^']+)'", dep.get("marker", ""))
        out.add((canonicalize_name(dep["name"]), extra.group(1) if extra else "",
                 SpecifierSet(dep.get("specifier", ""))))  # fmt: skip
    return out, list(pkg["metadata"].get("provides-extras", []))


def lock_drift(pyproject_text: str, lock_text: str) -> list[str]:
    """What differs between pyproject's requirements and the lock's record of them."""
    pyproject, lock = tomllib.loads(pyproject_text), tomllib.loads(lock_text)
    want = wanted(pyproject)
    have, extras = locked(lock, canonicalize_name(pyproject["project"]["name"]))
    show = lambda k: f"{k[0]}{k[2]}" + (f" [{k[1]}]" if k[1] else "")  # noqa: E731
    problems = [f"not in uv.lock: {show(k)}" for k in sorted(want - have, key=str)]
    problems += [f"in uv.lock only: {show(k)}" for k in sorted(have - want, key=str)]
    declared = set(pyproject["project"].get("optional-dependencies", {}))
    if set(extras) != declared:
        problems.append(f"extras: pyproject {sorted(declared)}, uv.lock {sorted(extras)}")
    return problems


def stale(pyproject_text: str) -> str:
    """pyproject with one more core dependency than any lock made from it knows."""
    return pyproject_text.replace("dependencies = [\n", 'dependencies = [\n    "six>=1.16",\n', 1)


def test_lock_records_pyproject_requirements() -> None:
    problems = lock_drift((REPO / "pyproject.toml").read_text(), (REPO / "uv.lock").read_text())
    assert not problems, "uv.lock is out of date: run `uv lock`\n" + "\n".join(problems)


def test_stale_lock_is_caught() -> None:
    text = (REPO / "pyproject.toml").read_text()
    problems = lock_drift(stale(text), (REPO / "uv.lock").read_text())
    assert problems == ["not in uv.lock: six>=1.16"]


def test_lock_resolves_from_pypi_alone() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "index" not in pyproject.get("tool", {}).get("uv", {}), "no index but PyPI"
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    sources = {next(iter(p["source"].items())) for p in lock["package"]}
    assert sources - {("registry", PYPI)} == {("editable", ".")}
    torch = [p for p in lock["package"] if p["name"] == "torch"]
    assert torch and all("+" not in p["version"] for p in torch), "PyPI's torch, no local build"


def uv_check(uv: list[str], project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*uv, "lock", "--check", "--offline"], cwd=project,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_uv_lock_check_offline(tmp_path: Path) -> None:
    uv = uv_command()
    if uv is None:
        pytest.skip(
            "uv is not installed (the dev extra installs it; test_lock_records_"
            "pyproject_requirements checks the lock without it)"
        )
    proc = uv_check(uv, REPO)
    assert proc.returncode == 0, f"uv.lock is out of date: run `uv lock`\n{proc.stderr[-3000:]}"
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "pyproject.toml").write_text(stale((REPO / "pyproject.toml").read_text()))
    proc = uv_check(uv, tmp_path)
    assert proc.returncode != 0, "uv lock --check passed a lock that lacks a dependency"
