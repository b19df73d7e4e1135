"""Turn a growing list of token ids into text that is safe to send, honouring stop strings.

`StopTextStream` decodes the whole completion after each token and releases only text
that can no longer change: it holds back an unfinished UTF-8 character ("\\ufffd" at the
end) and any tail that may be the start of a stop string. Once a stop string appears the
text is cut before it and the stream is `stopped`. Pure Python; knows no model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


def _held_tail(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


class StopTextStream:
    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._ids: list[int] = []
        self._released = ""  # text already handed out
        self.stopped = False

    @property
    def text(self) -> str:
        return self._released

    def push(self, token_id: int) -> str:
        """Add one token; return the text newly safe to send (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        full = self._decode(self._ids)
        cut = self._first_stop(full)
        if cut is not None:
            self.stopped = True
            return self._release(full[:cut])
        if full.endswith(REPLACEMENT):
            return ""
        return self._release(full[: len(full) - _held_tail(full, self._stops)])

    def finish(self) -> str:
        """Generation ended without a stop string: release whatever is held."""
        if self.stopped or not self._ids:
            return ""
        return self._release(self._decode(self._ids))

    def _first_stop(self, full: str) -> int | None:
        # Only text past what was released can hold a new stop string (minus overlap).
        start = max(0, len(self._released) - max((len(s) for s in self._stops), default=0))
        hits = [i for i in (full.find(s, start) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    def _release(self, upto: str) -> str:
        if not upto.startswith(self._released):
            # The tokenizer rewrote earlier text (rare); never take back what was sent.
            return ""
        new = upto[len(self._released) :]
        self._released = upto
        return new
