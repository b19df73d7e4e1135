"""A terminal progress bar for long startup steps (loading blocks), no dependencies.

On a terminal it redraws one line; elsewhere (logs, pipes) it prints a line at 0%, 50% and
100% so a log still shows that work is going on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO


def progress_bar(
    label: str, *, stream: TextIO | None = None, width: int = 30
) -> Callable[[int, int], None]:
    """A `progress(done, total)` callback that draws `label [#####.....] done/total`."""
    out = stream if stream is not None else sys.stderr
    tty = out.isatty()
    printed: set[int] = set()

    def update(done: int, total: int) -> None:
        filled = width * done // max(total, 1)
        line = f"{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        if tty:
            out.write("\r" + line + ("\n" if done >= total else ""))
            out.flush()
            return
        stage = 2 * done // max(total, 1)  # 0 (started), 1 (half way) or 2 (done)
        if stage not in printed:
            printed.add(stage)
            out.write(line + "\n")
            out.flush()

    return update
