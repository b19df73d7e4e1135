"""Concurrent decode steps of one model share one read of its LM head.

Threads of one process decoding at once (concurrent generate() calls) each project a few rows
through the head, the client's largest cost per token (SmolLM2's reads 113 MB of weights).
Alone, a call runs as it always did. A call that arrives while another one computes waits, and
every call that queued meanwhile is computed together by the next one to run: the head's
weights are read a slice at a time and each slice serves every queued row while it is still
in the CPU's cache. Each call's rows are still their own product over the same weights, so
its logits do not depend on which other calls shared the pass (checked bitwise against the
direct product in tests). No timer: nobody ever waits for a caller that has not come.
Calls with gradients, more than a few rows, off the CPU or through a quantized head are
never shared.
Knows nothing of sessions or the network.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from drift.models.rows import linear

if TYPE_CHECKING:
    from drift.models.head import ClientHead

SHARE_MAX_ROWS = 8  # a call with more rows (a prompt's full logits) runs alone
SLICE_ROWS = 2048  # vocabulary rows of the head per slice (SmolLM2: 4.7 MB of float32)


@dataclass
class _Ask:
    rows: torch.Tensor  # [n, H]
    out: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False


class SharedHead:
    """`project` as ClientHead.project, shared between the threads calling it at once."""

    def __init__(self, head: ClientHead, slice_rows: int = SLICE_ROWS) -> None:
        self.head = head
        self.slice_rows = slice_rows
        self._cond = threading.Condition()
        self._queue: list[_Ask] = []
        self._busy = False  # a caller is computing
        self.passes = 0  # shared passes run
        self.rows_shared = 0  # rows they served

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> [B, T, V] logits, as ClientHead.project."""
        if not self._shareable(normed):
            return self.head.project(normed)
        rows = normed.shape[0] * normed.shape[1]
        ask = _Ask(normed.reshape(rows, normed.shape[-1]))
        with self._cond:
            if not self._busy and not self._queue:  # alone: the direct product
                self._busy = True
                batch = None
            else:
                self._queue.append(ask)
                while self._busy and not ask.done:
                    self._cond.wait()
                if ask.done:
                    return self._result(ask, normed)
                self._busy, batch, self._queue = True, self._queue, []
        try:
            if batch is None:
                return self.head.project(normed)
            self._run(batch)
            return self._result(ask, normed)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _shareable(self, normed: torch.Tensor) -> bool:
        """A decode step's few rows on the CPU, through a plain Linear, with no gradient."""
        weight = self.head.lm_head.weight
        grad = torch.is_grad_enabled() and (normed.requires_grad or weight.requires_grad)
        return (normed.dim() == 3 and normed.shape[0] * normed.shape[1] <= SHARE_MAX_ROWS
                and normed.device.type == "cpu" and type(self.head.lm_head) is torch.nn.Linear
                and weight.dtype.is_floating_point and not grad)  # fmt: skip

    def _run(self, batch: list[_Ask]) -> None:
        """Every ask of `batch` through the head, slice by slice; results into each ask."""
        try:
            outs = self._product([a.rows for a in batch])
        except BaseException as exc:  # each caller raises it
            for a in batch:
                a.error, a.done = exc, True
            return
        for a, out in zip(batch, outs, strict=True):
            a.out, a.done = out, True
        self.passes += 1
        self.rows_shared += sum(int(a.rows.shape[0]) for a in batch)

    @torch.no_grad()
    def _product(self, asks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each [n, H] ask -> [n, V]: its own product over slices of the head's weight (the
        direct product's values: a slice of the vocabulary does not change a row's sum), then
        the family's logit softcapping."""
        weight, bias = self.head.lm_head.weight, self.head.lm_head.bias
        xs = [x.to(weight.dtype) for x in asks]
        outs = [x.new_empty(x.shape[0], weight.shape[0]) for x in xs]
        for start in range(0, weight.shape[0], self.slice_rows):
            stop = min(start + self.slice_rows, weight.shape[0])
            w, b = weight[start:stop], None if bias is None else bias[start:stop]
            for x, out in zip(xs, outs, strict=True):
                out[:, start:stop] = linear(x, w, b, self.head.row_pads)
        return [self.head.capped(o) for o in outs]

    @staticmethod
    def _result(ask: _Ask, normed: torch.Tensor) -> torch.Tensor:
        if ask.error is not None:
            raise ask.error
        assert ask.out is not None
        return ask.out.reshape(*normed.shape[:-1], ask.out.shape[-1])
