"""A Hugging Face cache laid out by hand: what a (partial) Hub fetch leaves on disk."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache_dir: Path, repo: str, files: Path) -> Path:
    """Lay out `files` as huggingface_hub's cache of `repo` at COMMIT (what a fetch leaves)."""
    root = cache_dir / "hub" / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    shutil.copytree(files, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot
