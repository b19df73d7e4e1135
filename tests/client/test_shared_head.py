"""Concurrent decode steps of one model share one scan over its LM head (drift.client.shared_head):
a thread alone gets the direct product bitwise; calls at once share a scan, joining mid-way
and wrapping round, their logits the direct product's to float rounding with the same argmax."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from drift.client import shared_head as sh
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
        self.direct = 0
        self.row_pads: dict[int, int] = {}  # few-row products padded (drift.models.rows)

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        self.direct += 1
        return self.capped(linear(normed, self.lm_head.weight, self.lm_head.bias, self.row_pads))

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap


class GatedSlices:
    """Stands in for the scan's product: counts slices and holds the scan before slice
    `hold_at` until `go` is set (callers arrive meanwhile)."""

    def __init__(self, hold_at: int, fail_at: int | None = None) -> None:
        self.hold_at, self.fail_at = hold_at, fail_at
        self.calls: list[int] = []  # rows of each slice's product
        self.holding = threading.Event()
        self.go = threading.Event()

    def __call__(self, x, weight, bias, pads, product=None):  # noqa: ANN001, ANN204 -- linear's
        if len(self.calls) == self.hold_at:
            self.holding.set()
            self.go.wait(30)
        if len(self.calls) == self.fail_at:
            self.fail_at = None
            raise RuntimeError("the product failed")
        self.calls.append(int(x.shape[0]))
        return linear(x, weight, bias, pads, product)


def wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "the calls never got there"
        time.sleep(0.001)


def start(
    shared: SharedHead, rows: torch.Tensor, out: dict[int, object], i: int
) -> threading.Thread:
    def call() -> None:  # as generate() calls it: no gradient (a thread's own mode)
        try:
            with torch.no_grad():
                out[i] = shared.project(rows)
        except BaseException as exc:  # noqa: BLE001 -- checked by the test
            out[i] = exc

    thread = threading.Thread(target=call)
    thread.start()
    return thread


@pytest.fixture
def not_alone():
    """`not_alone(shared)`: another thread projects just now (and stays alive, keeping its
    thread id its own), so the next calls share a scan."""
    done = threading.Event()
    threads = []

    def other(shared: SharedHead) -> None:
        with torch.no_grad():
            shared.project(torch.zeros(1, 1, 96))
        done.wait(60)

    def make(shared: SharedHead) -> None:
        projected = shared.lone
        threads.append(threading.Thread(target=other, args=(shared,)))
        threads[-1].start()
        wait_for(lambda: shared.lone > projected)

    yield make
    done.set()
    for t in threads:
        t.join(30)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_thread_alone_gets_the_direct_product_bitwise() -> None:
    head = Head(softcap=30.0, bias=True)
    shared = SharedHead(head, slice_rows=1024)
    x = torch.randn(2, 1, 96)
    with torch.no_grad():
        want = head.project(x)
        for _ in range(3):
            assert torch.equal(shared.project(x), want)
    assert shared.lone == 3 and shared.scans == 0


@pytest.mark.parametrize("pads", [{}, {2: 4, 3: 8}], ids=["plain", "padded"])
@pytest.mark.parametrize("softcap,bias", [(None, False), (30.0, True)])
def test_calls_at_once_share_one_scan_joining_mid_way(monkeypatch, not_alone, softcap, bias,
                                                      pads) -> None:  # fmt: skip
    """The first call scans alone until the others arrive (during its third slice); they
    join at the next, and the scan wraps round to the three slices they missed: 5 + 3
    products for 4 calls, each call's logits the direct product's. Also where the head pads
    few-row products (drift.models.rows)."""
    head = Head(softcap=softcap, bias=bias)
    head.row_pads = pads
    shared = SharedHead(head, slice_rows=1024)  # 5 slices, the last one short
    gate = GatedSlices(hold_at=2)
    monkeypatch.setattr(sh, "linear", gate)
    rows = [torch.randn(1, 1, 96), torch.randn(2, 1, 96), torch.randn(1, 1, 96),
            torch.randn(3, 1, 96)]  # fmt: skip
    with torch.no_grad():
        want = [head.project(r) for r in rows]
    not_alone(shared)
    head.direct = 0
    out: dict[int, object] = {}
    threads = [start(shared, rows[0], out, 0)]
    assert gate.holding.wait(10)
    threads += [start(shared, rows[i], out, i) for i in range(1, len(rows))]
    wait_for(lambda: len(shared._joining) == len(rows) - 1)
    gate.go.set()
    for t in threads:
        t.join(30)
    assert head.direct == 0 and shared.scans == 1 and shared.rows_shared == 7
    assert gate.calls == [1, 1, 1, 7, 7, 6, 6, 6]  # 3 alone; 2 with all; 3 the others missed
    for i, w in enumerate(want):
        close(out[i], w)  # type: ignore[arg-type]


def test_a_worker_done_first_hands_the_scan_on(monkeypatch, not_alone) -> None:
    """The first caller's own slices end before the joiner's: it returns, and the joiner
    finishes the scan itself."""
    head = Head()
    shared = SharedHead(head, slice_rows=1000)  # 5 slices
    gate = GatedSlices(hold_at=3)
    monkeypatch.setattr(sh, "linear", gate)
    a, b = torch.randn(1, 1, 96), torch.randn(1, 1, 96)
    with torch.no_grad():
        want = [head.project(a), head.project(b)]
    not_alone(shared)
    out: dict[int, object] = {}
    first = start(shared, a, out, 0)
    assert gate.holding.wait(10)
    second = start(shared, b, out, 1)
    wait_for(lambda: len(shared._joining) == 1)
    gate.go.set()
    first.join(30)
    second.join(30)
    assert gate.calls == [1, 1, 1, 1, 2, 1, 1, 1, 1]  # the joiner's 4 after the first's 5
    close(out[0], want[0])  # type: ignore[arg-type]
    close(out[1], want[1])  # type: ignore[arg-type]
    assert not shared._busy and not shared._active


def test_a_failed_scan_fails_every_caller_in_it(monkeypatch, not_alone) -> None:
    head = Head()
    shared = SharedHead(head, slice_rows=1000)
    gate = GatedSlices(hold_at=0, fail_at=2)
    monkeypatch.setattr(sh, "linear", gate)
    rows = [torch.randn(1, 1, 96) for _ in range(3)]
    not_alone(shared)
    out: dict[int, object] = {}
    threads = [start(shared, rows[0], out, 0)]
    assert gate.holding.wait(10)
    threads += [start(shared, rows[i], out, i) for i in (1, 2)]
    wait_for(lambda: len(shared._joining) == 2)
    gate.go.set()
    for t in threads:
        t.join(30)
    assert all(isinstance(out[i], RuntimeError) for i in range(3))  # all were in the scan
    with torch.no_grad():
        close(shared.project(rows[1]), head.project(rows[1]))  # usable afterwards
    assert not shared._busy


def test_many_threads_at_once_all_get_their_rows() -> None:
    """No gate: 8 threads in a burst, as a convoy's replies wake them, 20 times."""
    head = Head(vocab=20000)
    shared = SharedHead(head, slice_rows=2048)
    xs = [torch.randn(1, 1, 96) for _ in range(8)]
    with torch.no_grad():
        want = [head.project(x) for x in xs]
    for _ in range(20):
        out: dict[int, object] = {}
        threads = [start(shared, x, out, i) for i, x in enumerate(xs)]
        for t in threads:
            t.join(30)
        for i, w in enumerate(want):
            close(out[i], w)  # type: ignore[arg-type]
    assert shared.scans >= 1 and not shared._busy


def test_what_is_never_shared(not_alone) -> None:
    head = Head()
    shared = SharedHead(head)
    not_alone(shared)
    big = torch.randn(1, 9, 96)  # a prompt's full logits: more rows than a decode step
    grad = torch.randn(1, 1, 96, requires_grad=True)
    for x in (big, grad):
        head.direct = 0
        assert torch.equal(shared.project(x), head.project(x))
        assert head.direct == 2  # both direct
    with pytest.raises(RuntimeError):  # the wrong width fails alone, directly
        shared.project(torch.randn(1, 1, 95))
    assert shared.scans == 0 and not shared._busy
