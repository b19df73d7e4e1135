"""Few-row products padded with zero rows (drift.models.rows): the chooser keeps a pad only
where the measured pass was clearly faster, padded products equal the plain ones (values and
gradients), and small weights are not measured at all."""

from __future__ import annotations

import pytest
import torch

from drift.models import rows


def test_table_pads_only_to_a_clearly_faster_count(monkeypatch) -> None:
    """Seconds per pass as this machine's MKL gave them for SmolLM2's span (ms): 2 and 3 rows
    go to 4; 7 rows would save 9.8% at 8, under GAIN, so stay."""
    cost = {1: 5.4, 2: 8.9, 3: 9.6, 4: 7.5, 5: 8.1, 6: 8.2, 7: 9.2, 8: 8.3}
    clock = [0.0]
    monkeypatch.setattr(rows.time, "perf_counter", lambda: clock[0])

    def one_pass(m: int) -> None:
        clock[0] += cost[m] / 1e3

    pads, medians = rows.table(one_pass, rounds=3)
    assert pads == {2: 4, 3: 4}
    assert medians == pytest.approx({m: c / 1e3 for m, c in cost.items()})
    cost.update({7: 10.0})  # now 8 rows are 17% faster than 7
    assert rows.table(one_pass, rounds=3)[0] == {2: 4, 3: 4, 7: 8}
    cost.update({2: 7.6, 3: 7.6})  # 4 rows no longer 10% faster than 2 or 3
    assert rows.table(one_pass, rounds=3)[0] == {7: 8}


@pytest.mark.parametrize("shape", [(2, 16), (3, 16), (1, 3, 16), (2, 1, 16)])
def test_padded_products_equal_plain_ones(shape) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 16, generator=gen, requires_grad=True)
    bias = torch.randn(40, generator=gen)
    x = torch.randn(*shape, generator=gen, requires_grad=True)
    got = rows.linear(x, weight, bias, {2: 4, 3: 8})
    want = torch.nn.functional.linear(x, weight, bias)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-6)
    (g_x, g_w), (w_x, w_w) = (torch.autograd.grad(out.square().sum(), (x, weight))
                              for out in (got, want))  # fmt: skip
    assert torch.allclose(g_x, w_x, atol=1e-5) and torch.allclose(g_w, w_w, atol=1e-5)


def test_weights_in_the_caches_are_not_measured() -> None:
    small = [torch.randn(64, 64) for _ in range(4)]
    assert rows.measure(small) == ({}, {})
    assert not rows.measurable([torch.randn(8, 8, dtype=torch.float32).to(torch.int32)])


def test_measured_pads_point_at_faster_counts() -> None:
    """On real-size weights (SmolLM2's MLP shapes, 42 MiB): whatever this CPU's table is, each
    pad goes up to a count whose pass was at least GAIN faster."""
    weights = [torch.randn(*shape) for shape in [(1536, 576), (576, 1536)] * 6]
    assert rows.measurable(weights)
    pads, medians = rows.measure(weights, rounds=3)
    assert sorted(medians) == list(range(1, rows.MAX_ROWS + 1))
    for m, to in pads.items():
        assert m < to <= rows.MAX_ROWS and medians[to] <= (1 - rows.GAIN) * medians[m]


def test_a_pass_reads_at_most_pass_bytes(monkeypatch) -> None:
    """A head bigger than a pass (Gemma 3's is 640 MiB) is timed on its first rows."""
    monkeypatch.setattr(rows, "MIN_BYTES", 0)
    monkeypatch.setattr(rows, "PASS_BYTES", 1 << 20)
    seen: list[tuple[int, ...]] = []
    plain = torch.nn.functional.linear

    def counted(x, w, b=None):
        seen.append(tuple(w.shape))
        return plain(x, w, b)

    monkeypatch.setattr(torch.nn.functional, "linear", counted)
    head = torch.randn(4096, 128)  # 2 MiB
    rows.measure([head, torch.randn(64, 128)], rounds=1)
    assert seen and set(seen) == {(2048, 128)}  # its first 1 MiB; the next weight left out
