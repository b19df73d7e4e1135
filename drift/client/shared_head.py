"""Concurrent decode steps of one model share one read of its LM head.

Threads of one process decoding at once (concurrent generate() calls) each project a few rows
through the head, the client's largest cost per token (SmolLM2's reads 113 MB of weights).
A thread that is the only one to have called lately runs its product directly, as it always
did. Otherwise calls share a scan of the head: one of them (the worker) goes over the head's
weights a slice of the vocabulary at a time, each slice multiplied once by the rows of every
call in the scan, stacked; a call that arrives mid-scan joins at the current slice and is done
once it has had every slice (the scan wraps round to the slices it missed). Nobody waits for a
caller that has not come, and the calls of one convoy (steps whose replies came together,
waking their threads one after another) end up in one scan, not in a pass of the first alone
and a second for the rest. A worker whose own call is done hands the scan on to a caller still
in it and returns. Rows stacked with other calls' rows are a product of more rows than the
direct one: the same sums, which MKL may round differently in the last bit (as the servers'
batched steps do); tests/client/test_shared_head.py checks them against the direct product
and that a lone thread's logits are bitwise the direct ones.
Calls with gradients, more than a few rows, off the CPU or through a quantized head are
never shared. Knows nothing of sessions or the network.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from drift.models.row_kernel import product_of
from drift.models.rows import linear

if TYPE_CHECKING:
    from drift.models.head import ClientHead

SHARE_MAX_ROWS = 8  # a call with more rows (a prompt's full logits) runs alone
SLICE_ROWS = 2048  # vocabulary rows of the head per slice (SmolLM2: 4.7 MB of float32)
RECENT_S = 1.0  # another thread projected this recently: calls share a scan


@dataclass
class _Ask:
    rows: torch.Tensor  # [n, H]
    out: torch.Tensor | None = None  # [n, V], filled slice by slice
    left: int = 0  # slices still to compute
    error: BaseException | None = None
    done: bool = False


class SharedHead:
    """`project` as ClientHead.project, shared between the threads calling it at once."""

    def __init__(self, head: ClientHead, slice_rows: int = SLICE_ROWS) -> None:
        self.head = head
        self.slice_rows = slice_rows
        self._cond = threading.Condition()
        self._joining: list[_Ask] = []  # arrived, not yet in the scan
        self._active: list[_Ask] = []  # in the scan
        self._busy = False  # a worker is scanning (or a lone call computing)
        self._handoff = False  # the worker left: a caller still in the scan takes it on
        self._slice = 0  # the scan's next slice
        self._callers: dict[int, float] = {}  # thread id -> when it last projected
        self.scans = 0  # scans run
        self.rows_shared = 0  # rows they served
        self.lone = 0  # direct products of a thread alone

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """[B, T, H] -> [B, T, V] logits, as ClientHead.project."""
        if not self._shareable(normed):
            return self.head.project(normed)
        rows = normed.shape[0] * normed.shape[1]
        ask = _Ask(normed.reshape(rows, normed.shape[-1]))
        with self._cond:
            if self._alone() and not self._busy:  # the direct product, as always
                self._busy = True
                self.lone += 1
                lone = True
            else:
                lone = False
                self._joining.append(ask)
                if self._busy:
                    while not ask.done and not self._handoff:
                        self._cond.wait()
                    if ask.done:
                        return self._result(ask, normed)
                    self._handoff = False
                self._busy = True
                self.scans += int(not self._active)
        if lone:
            try:
                return self.head.project(normed)
            finally:
                with self._cond:
                    self._leave()
        self._scan(ask)
        return self._result(ask, normed)

    def _alone(self) -> bool:
        """(Lock held) Whether no other thread projected lately; notes this one's call."""
        now, me = time.monotonic(), threading.get_ident()
        self._callers = {t: at for t, at in self._callers.items() if now - at <= RECENT_S}
        others = any(t != me for t in self._callers)
        self._callers[me] = now
        return not others and not self._joining

    def _leave(self) -> None:
        """(Lock held) The worker (or lone call) is done: a caller waiting takes over."""
        if self._active or self._joining:
            self._handoff = True
        else:
            self._busy = False
        self._cond.notify_all()

    def _shareable(self, normed: torch.Tensor) -> bool:
        """A decode step's few rows of the head's width on the CPU, through a plain Linear,
        with no gradient (a call of the wrong width fails alone, in the direct product)."""
        weight = self.head.lm_head.weight
        grad = torch.is_grad_enabled() and (normed.requires_grad or weight.requires_grad)
        return (normed.dim() == 3 and normed.shape[0] * normed.shape[1] <= SHARE_MAX_ROWS
                and normed.shape[-1] == weight.shape[1] and normed.device.type == "cpu"
                and type(self.head.lm_head) is torch.nn.Linear
                and weight.dtype.is_floating_point and not grad)  # fmt: skip

    @torch.no_grad()
    def _scan(self, mine: _Ask) -> None:
        """As the worker: slice after slice, every call in the scan at once, until `mine` is
        done; then hand the scan on (or end it)."""
        weight, bias = self.head.lm_head.weight, self.head.lm_head.bias
        product = product_of(self.head.lm_head)
        vocab = weight.shape[0]
        slices = -(-vocab // self.slice_rows)
        stacked: torch.Tensor | None = None
        try:
            while True:
                with self._cond:
                    changed = self._admit(slices, weight.dtype)
                    if mine.done:
                        self._leave()
                        return
                    active, index = list(self._active), self._slice
                if changed or stacked is None:
                    stacked = torch.cat([a.rows.to(weight.dtype) for a in active])
                start = index * self.slice_rows
                stop = min(start + self.slice_rows, vocab)
                part = linear(stacked, weight[start:stop],
                              None if bias is None else bias[start:stop], self.head.row_pads,
                              product)  # fmt: skip
                row = 0
                for a in active:
                    n = a.rows.shape[0]
                    assert a.out is not None
                    a.out[:, start:stop] = part[row : row + n]
                    row += n
                    a.left -= 1
                self._slice = (index + 1) % slices
        except BaseException as exc:  # each caller in the scan raises it
            with self._cond:
                for a in [*self._active, *self._joining]:
                    a.error, a.done = exc, True
                self._active, self._joining = [], []
                self._busy = self._handoff = False
                self._cond.notify_all()

    def _admit(self, slices: int, dtype: torch.dtype) -> bool:
        """(Lock held) Finish the calls that had every slice, take in those that arrived;
        whether the scan's rows changed."""
        finished = [a for a in self._active if a.left == 0]
        for a in finished:
            assert a.out is not None
            a.out, a.done = self.head.capped(a.out), True
        self._active = [a for a in self._active if a.left > 0]
        for a in self._joining:
            a.out = torch.empty(a.rows.shape[0], self.head.lm_head.weight.shape[0], dtype=dtype)
            a.left = slices
            self.rows_shared += int(a.rows.shape[0])
        joined, self._active, self._joining = bool(self._joining), self._active + self._joining, []
        if finished:
            self._cond.notify_all()
        return bool(finished) or joined

    @staticmethod
    def _result(ask: _Ask, normed: torch.Tensor) -> torch.Tensor:
        if ask.error is not None:
            raise ask.error
        assert ask.out is not None
        return ask.out.reshape(*normed.shape[:-1], ask.out.shape[-1])
