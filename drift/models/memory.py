"""This process's resident memory, and handing freed heap memory back to the OS.

`resident_bytes` reads /proc/self/statm (Linux; None elsewhere). `trim_heap` asks glibc to
return freed heap pages: loading a quantized span frees a float copy of every weight in
chunks that glibc would otherwise keep. Knows nothing of models or servers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path


def resident_bytes() -> int | None:
    """Resident set size of this process in bytes, or None where /proc is not available."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> None:
    """glibc's malloc_trim(0): return free heap memory to the OS; a no-op without glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return
    trim(0)
