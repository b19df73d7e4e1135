"""A Hugging Face cache laid out by hand: what a (partial) Hub fetch leaves on disk."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(repo: str, files: Path) -> Path:
    """Lay out `files` as huggingface_hub's cache of `repo` at COMMIT (what a fetch leaves),
    in the Hugging Face cache (tests/conftest.py points HF_HOME at a temporary dir)."""
    from huggingface_hub import constants

    assert "drift-test-hf-" in constants.HF_HUB_CACHE  # never the user's cache
    root = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    shutil.copytree(files, snapshot)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot
