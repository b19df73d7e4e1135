"""Block spans as people write them: `START:END` on the command line, `[a, b)` and `0-2, 5`
in messages. The one place that parses and formats block ranges; pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable

from drift.wire.errors import BadRequest


def parse_span(text: str, *, option: str = "--block_indices") -> tuple[int, int]:
    """'0:15' -> (0, 15), half-open; BadRequest naming `option` otherwise."""
    start, colon, end = text.partition(":")
    if not colon or not start.strip().isdigit() or not end.strip().isdigit():
        raise BadRequest(f"{option} {text!r} must look like START:END, e.g. 0:15")
    return int(start), int(end)


def format_span(start_block: int, end_block: int) -> str:
    """(0, 15) -> '[0, 15)'."""
    return f"[{start_block}, {end_block})"


def format_ranges(blocks: Iterable[int]) -> str:
    """[7, 0, 1, 2, 5, 8] -> '0-2, 5, 7-8' (sorted runs; '' for none)."""
    runs: list[list[int]] = []
    for i in sorted(set(blocks)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
