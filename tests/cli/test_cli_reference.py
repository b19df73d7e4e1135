"""The CLI reference: scripts/gen_cli_reference.py covers every flag of every command, and
docs/cli.md (which it writes) is exactly its current output: complete, inventing nothing."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from drift.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*[a-z0-9]")


def flags_by_command() -> dict[str, set[str]]:
    parser = build_parser()
    out: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = {
                    s for a in sub._actions for s in a.option_strings
                    if s.startswith("--") and s != "--help"
                }  # fmt: skip
    return out


def global_flags() -> set[str]:
    return {s for a in build_parser()._actions for s in a.option_strings if s.startswith("--")}


def check(section: str) -> None:
    """Every command and flag is in `section`; no table row names a flag no command has."""
    by_cmd = flags_by_command()
    assert len(by_cmd) >= 8
    for cmd, flags in by_cmd.items():
        assert f"drift {cmd}" in section, f"command {cmd} is not in the reference"
        missing = sorted(f for f in flags if not re.search(rf"`{re.escape(f)}`", section))
        assert not missing, f"drift {cmd}: flags missing from the reference: {missing}"
    known = set().union(*by_cmd.values()) | global_flags()
    rows = [ln for ln in section.splitlines() if ln.lstrip().startswith("|")]
    unknown = sorted({f for row in rows for f in FLAG_RE.findall(row)} - known)
    assert not unknown, f"the reference names flags no command has: {unknown}"


def test_generated_reference_is_complete() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_reference.py"),
                           "--stdout"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    check(proc.stdout)
    with pytest.raises(AssertionError, match="no command has"):
        check(proc.stdout + "\n| `--no_such_flag` | - | invented |\n")
    with pytest.raises(AssertionError, match="missing"):
        check(proc.stdout.replace("`--swarm_key`", "`swarm key`"))


def test_docs_cli_md_is_the_generated_reference() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_cli_reference.py"),
                           "--stdout"], capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (REPO / "docs" / "cli.md").read_text() == proc.stdout, (
        "docs/cli.md is out of date: run python scripts/gen_cli_reference.py"
    )
    check((REPO / "docs" / "cli.md").read_text())
    assert "docs/cli.md" in (REPO / "README.md").read_text(), "README must link the reference"
