"""Where DRIFT keeps its files: the one rule for the cache directory.

The cache holds converted models, throughput measurements, `drift up`'s identity and the
process records `drift down` reads. Read at call time (nothing at import); no other imports,
so torch-free commands (`drift dht`, `drift down`) use it too.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DRIFT_CACHE"


def default_cache_dir() -> Path:
    """$DRIFT_CACHE, else ~/.cache/drift."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "drift"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """`cache_dir` as given (user-expanded), else the default."""
    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
