"""The startup progress bar: one redrawn line on a terminal, three plain lines in a log."""

from __future__ import annotations

import io

from drift.cli._progress import progress_bar


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_gets_start_middle_and_end_lines() -> None:
    out = io.StringIO()
    update = progress_bar("loading blocks", stream=out, width=10)
    for done in range(1, 16):
        update(done, 15)
    lines = out.getvalue().splitlines()
    assert lines == [
        "loading blocks [..........] 1/15",
        "loading blocks [#####.....] 8/15",
        "loading blocks [##########] 15/15",
    ]


def test_terminal_redraws_one_line() -> None:
    out = _Tty()
    update = progress_bar("x", stream=out, width=4)
    for done in range(1, 5):
        update(done, 4)
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("x [####] 4/4\n")
