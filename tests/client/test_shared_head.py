"""Concurrent decode steps of one model share one pass over its LM head, and every row's
logits are bitwise those of the direct product (drift.client.shared_head)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from drift.client.shared_head import SharedHead
from drift.models.rows import linear


class Head(torch.nn.Module):
    """A ClientHead's projection: lm_head, then the family's softcapping (None: none), as
    drift.models.head.ClientHead has them."""

    def __init__(self, vocab: int = 5000, hidden: int = 96, softcap: float | None = None,
                 bias: bool = False) -> None:  # fmt: skip
        super().__init__()
        torch.manual_seed(0)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=bias)
        self.softcap = softcap
        self.gate: threading.Event | None = None  # holds the direct call (others queue)
        self.direct = 0
        self.row_pads: dict[int, int] = {}  # few-row products padded (drift.models.rows)

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        self.direct += 1
        if self.gate is not None:
            self.gate.wait(30)
        return self.capped(linear(normed, self.lm_head.weight, self.lm_head.bias, self.row_pads))

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap


def wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the calls never queued"
        time.sleep(0.001)


def together(shared: SharedHead, head: Head, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """rows[0] computed directly while it is held; the others arrive meanwhile and queue."""
    head.gate = threading.Event()
    out: list[torch.Tensor | BaseException | None] = [None] * len(rows)

    def call(i: int) -> None:  # as generate() calls it: no gradient (a thread's own mode)
        try:
            with torch.no_grad():
                out[i] = shared.project(rows[i])
        except BaseException as exc:  # noqa: BLE001 -- checked by the test
            out[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    wait_for(lambda: head.direct > 0)
    others = [threading.Thread(target=call, args=(i,)) for i in range(1, len(rows))]
    for t in others:
        t.start()
    wait_for(lambda: len(shared._queue) == len(rows) - 1)
    head.gate.set()
    for t in [first, *others]:
        t.join(30)
    head.gate = None
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("pads", [{}, {2: 4, 3: 8}], ids=["plain", "padded"])
@pytest.mark.parametrize("softcap,bias", [(None, False), (30.0, True)])
def test_queued_calls_share_one_pass_and_keep_each_rows_logits(softcap, bias, pads) -> None:
    """Also where the head pads few-row products (drift.models.rows): a shared pass pads
    each call's rows as its direct product does."""
    head = Head(softcap=softcap, bias=bias)
    head.row_pads = pads
    shared = SharedHead(head, slice_rows=1024)  # 5 slices, the last one short
    rows = [torch.randn(1, 1, 96), torch.randn(2, 1, 96), torch.randn(1, 1, 96),
            torch.randn(3, 1, 96)]  # fmt: skip
    with torch.no_grad():
        want = [head.project(r) for r in rows]
        head.direct = 0
        got = together(shared, head, rows)
    assert head.direct == 1  # the first alone; the 3 queued ones in one shared pass
    assert shared.passes == 1 and shared.rows_shared == 6
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)


def test_a_failed_pass_fails_every_caller_in_it() -> None:
    head = Head()
    shared = SharedHead(head)
    rows = [torch.randn(1, 1, 96), torch.randn(1, 1, 96), torch.randn(1, 1, 95)]  # a bad width
    with torch.no_grad():
        got = together(shared, head, rows)
    assert isinstance(got[0], torch.Tensor)
    assert all(isinstance(g, RuntimeError) for g in got[1:])  # the pass the bad row was in
    assert torch.equal(shared.project(rows[1]), head.project(rows[1]))  # usable afterwards


def test_what_is_never_shared() -> None:
    head = Head()
    shared = SharedHead(head)
    big = torch.randn(1, 9, 96)  # a prompt's full logits: more rows than a decode step
    grad = torch.randn(1, 1, 96, requires_grad=True)
    for x in (big, grad):
        head.direct = 0
        assert torch.equal(shared.project(x), head.project(x))
        assert head.direct == 2  # both direct
    assert shared.passes == 0
