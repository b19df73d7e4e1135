"""Helpers for the install tests: run scripts/install.sh in a scratch HOME, read its plan,
find uv (the dev extra brings it)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install.sh"


def run_install(home: Path, *args: str, fake_bin: Path | None = None, **env: str):
    base = {k: v for k, v in os.environ.items() if not k.startswith("DRIFT_")}
    base["HOME"] = str(home)
    if fake_bin is not None:
        base["PATH"] = f"{fake_bin}{os.pathsep}{base['PATH']}"
    base.update(env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=base, capture_output=True, text=True, timeout=60
    )


def plan_of(stdout: str) -> tuple[dict[str, str], list[str]]:
    fields, commands = {}, []
    for line in stdout.splitlines():
        if line.startswith("+ "):
            commands.append(line[2:])
        elif ": " in line:
            key, value = line.split(": ", 1)
            fields[key] = value
    return fields, commands


def uv_command() -> list[str] | None:
    if shutil.which("uv"):
        return ["uv"]
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    return None
