"""DRIFT's few-row product kernel (drift.models.row_kernel), built here with the machine's C
compiler: products equal F.linear's within float rounding at every shape (tails of the vector
width, bias, up to MAX_ROWS rows, one thread or two), what it does not take goes to F.linear
unchanged (gradients, bfloat16, a transposed weight, more rows), installed modules use it only
inside `activated` on that thread (their logits then match transformers'), copy and pickle,
one build per source/compiler/CPU, one OpenMP runtime, and a clear reason where it cannot be
built."""

from __future__ import annotations

import copy
import pickle
import shutil
import threading
from pathlib import Path

import pytest
import torch

from drift.models import row_kernel
from drift.models.row_kernel import (
    MAX_ROWS,
    RowKernel,
    activated,
    install_built,
    kernel_in,
    product_of,
)
from tests.tiny_models import build_tiny


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> RowKernel:
    """Built from scratch for these tests (this machine has a C compiler: the build must work)."""
    assert shutil.which("cc") or shutil.which("gcc"), "these tests need a C compiler (gcc)"
    built, why = RowKernel.build(tmp_path_factory.mktemp("cache"))
    assert built is not None, why
    assert why.startswith("DRIFT's row kernel"), why
    return built


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("width", [1, 15, 16, 17, 576, 1537])
@pytest.mark.parametrize("bias", [False, True])
def test_products_equal_torch(kernel, rows, width, bias) -> None:
    gen = torch.Generator().manual_seed(rows * 10_000 + width)
    out = 67 if width > 100 else 5
    x = torch.randn(rows, width, generator=gen)
    w = torch.randn(out, width, generator=gen) / width**0.5
    b = torch.randn(out, generator=gen) if bias else None
    assert kernel.takes(x, w, b)
    got, want = kernel.linear(x, w, b), torch.nn.functional.linear(x, w, b)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_batched_shapes_and_threads(kernel) -> None:
    """[B, T, H] inputs keep their shape; each output is one thread's sum, so one thread and
    two give the same bits."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 576, generator=gen)
    w = torch.randn(1536, 576, generator=gen) / 24
    want = torch.nn.functional.linear(x, w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.linear(x, w)
        torch.set_num_threads(2)
        two = kernel.linear(x, w)
    finally:
        torch.set_num_threads(before)
    assert one.shape == (2, 3, 1536)
    assert torch.equal(one, two)
    torch.testing.assert_close(one, want, rtol=1e-5, atol=1e-5)


def test_what_it_does_not_take_goes_to_torch_unchanged(kernel) -> None:
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 32, generator=gen)
    x = torch.randn(2, 32, generator=gen)
    cases = {
        "more rows than MAX_ROWS": (torch.randn(MAX_ROWS + 1, 32, generator=gen), w),
        "bfloat16": (x.bfloat16(), w.bfloat16()),
        "a weight stored [in, out]": (x, w.t().contiguous().t()),
        "a width that does not match": (torch.randn(2, 31, generator=gen), w),
    }
    for name, (xi, wi) in cases.items():
        assert not kernel.takes(xi, wi, None), name
        if xi.shape[-1] == wi.shape[1]:
            assert torch.equal(kernel.linear(xi, wi), torch.nn.functional.linear(xi, wi)), name
    with pytest.raises(RuntimeError):  # F.linear's own error, not a crash in C
        kernel.linear(cases["a width that does not match"][0], w)


def test_gradients_go_through_torch(kernel) -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(16, 8, generator=gen, requires_grad=True)
    x = torch.randn(1, 8, generator=gen, requires_grad=True)
    assert not kernel.takes(x, w, None)
    kernel.linear(x, w).sum().backward()
    assert x.grad is not None and w.grad is not None
    torch.testing.assert_close(w.grad, x.detach().expand(16, 8))
    with torch.no_grad():  # no gradient needed: the kernel takes it
        assert kernel.takes(x, w, None)


def test_an_installed_model_matches_transformers(kernel) -> None:
    """A tiny Llama with the kernel in its linears: outside `active()` its products are
    torch's, bit for bit; inside, its logits agree within float rounding and its greedy tokens
    are the same."""
    model = build_tiny("llama").float().eval()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        want = model(ids).logits
        want_tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
    plain = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert kernel.install(model) == plain > 0
    assert kernel_in(model) is kernel
    assert all(product_of(m) == kernel.product
               for m in model.modules() if type(m) is torch.nn.Linear)  # fmt: skip
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)  # not active: torch's BLAS
        with activated(kernel):
            got = model(ids).logits
            got_tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert not torch.equal(got, want)  # the kernel did compute them (another summation order)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got_tokens, want_tokens)


def test_active_is_per_thread(kernel) -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(300, 576, generator=gen)
    x = torch.randn(1, 576, generator=gen)
    plain = torch.nn.functional.linear(x, w)
    seen: list[torch.Tensor] = []
    with activated(kernel):
        mine = kernel.product(x, w)
        other = threading.Thread(target=lambda: seen.append(kernel.product(x, w)))
        other.start()
        other.join()
    assert torch.equal(seen[0], plain) and not torch.equal(mine, plain)
    assert torch.equal(kernel.product(x, w), plain)  # left: torch's again
    assert activated(None) is not None  # no kernel: a context that does nothing


def test_installed_modules_copy_and_pickle(kernel) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(576, 300), torch.nn.ReLU())
    kernel.install(model)
    x = torch.randn(2, 576)
    with torch.no_grad(), activated(kernel):
        want = model(x)
        copied = copy.deepcopy(model)
        assert kernel_in(copied) is kernel and torch.equal(copied(x), want)
        loaded = pickle.loads(pickle.dumps(model))  # the library loaded again from its path
        again = kernel_in(loaded)
        assert again is not None and again.path == kernel.path
        with activated(again):
            assert torch.equal(loaded(x), want)
    assert torch.equal(loaded[0].weight, model[0].weight)


def test_install_leaves_other_linears(kernel) -> None:
    class Quantized(torch.nn.Linear):  # as bitsandbytes' layers subclass nn.Linear
        pass

    root = torch.nn.Sequential(torch.nn.Linear(4, 4), Quantized(4, 4),
                               torch.nn.Linear(4, 4).bfloat16())  # fmt: skip
    assert kernel.install(root) == 1
    assert product_of(root[0]) == kernel.product
    assert product_of(root[1]) is torch.nn.functional.linear
    assert product_of(root[2]) is torch.nn.functional.linear
    assert kernel_in(torch.nn.Linear(4, 4)) is None


def test_one_build_per_cpu_and_one_openmp_runtime(kernel, tmp_path, monkeypatch) -> None:
    first, _ = RowKernel.build(tmp_path)
    again, _ = RowKernel.build(tmp_path)
    assert first is not None and again is not None and first.path == again.path
    monkeypatch.setattr(row_kernel, "_cpu", lambda: "another CPU")
    other, _ = RowKernel.build(tmp_path)
    assert other is not None and other.path != first.path  # never another CPU's build
    assert sorted(p.name for p in (tmp_path / "kernels").iterdir()) == sorted(
        [first.path.name, other.path.name]
    )  # no temporary files left
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(runtimes) == 1, runtimes  # the kernel's threads are torch's OpenMP pool


def test_no_compiler_or_a_failing_one_says_why(tmp_path) -> None:
    kernel, why = RowKernel.build(tmp_path, environ={"PATH": str(tmp_path)})
    assert kernel is None and "no C compiler" in why and "torch's BLAS" in why
    kernel, why = RowKernel.build(tmp_path, environ={"CC": shutil.which("false") or "false"})
    assert kernel is None and "did not build" in why, why
    assert not list((tmp_path / "kernels").iterdir())  # nothing half-written left


def test_install_built_builds_once_and_installs(kernel, tmp_path) -> None:
    """What servers and the SDK's head call: the build (from the cache once there) installed
    in every plain float32 linear of the module; no compiler: none, and why."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    count, why = install_built(model, tmp_path)
    assert count == 2 and why.startswith("DRIFT's row kernel"), why
    assert kernel_in(model) is not None
    again = torch.nn.Linear(8, 4)
    assert install_built(again, tmp_path) == (1, why)  # built already: the same library
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 1
    bare = torch.nn.Linear(8, 4)
    count, why = install_built(bare, tmp_path / "other", environ={"PATH": str(tmp_path)})
    assert count is None and "no C compiler" in why
    assert kernel_in(bare) is None
