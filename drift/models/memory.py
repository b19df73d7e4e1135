"""This process's resident memory, and handing freed heap memory back to the OS.

`resident_bytes` asks psutil (every platform). `trim_heap` asks glibc to
return freed heap pages: loading a quantized span frees a float copy of every weight in
chunks that glibc would otherwise keep. Knows nothing of models or servers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


def resident_bytes() -> int | None:
    """Resident set size of this process in bytes (psutil, every platform); None if unreadable."""
    import psutil

    try:
        return int(psutil.Process().memory_info().rss)
    except (psutil.Error, OSError):
        return None


def trim_heap() -> None:
    """glibc's malloc_trim(0): return free heap memory to the OS; a no-op without glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, looked up once (None: not glibc, e.g. musl or macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
