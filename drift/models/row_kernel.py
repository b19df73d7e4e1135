"""Products of a few float32 rows on the CPU that read each weight once, at the memory's rate.

A decode step multiplies one row per session by every weight of a span, and the client's
head multiplies one row by the vocabulary's. torch's CPU BLAS (MKL) serves such products at
about half of what the memory streams, and no faster on more threads: SmolLM2's 15-block
span (212 MB of weights) took 17.2 ms a pass on one thread and 17.9 on two, where a plain
read of as many bytes took 8.3 (scripts/bench_kernels.py). The C kernel beside this file
(row_kernel.c) reads each weight row once as one stream, multiplies it by up to 4 rows at a
time, and splits the rows across torch's OpenMP threads: 12.2 ms on one thread, 8.1 on two.

It is built at first use by the machine's C compiler ($CC, else cc or gcc on PATH) for this
CPU (-O3 -march=native -fopenmp) into `<cache>/kernels/`, named by a hash of the source,
the compiler and the CPU, so a cache shared by machines never hands one another's build
(a compile takes ~0.3 s). `RowKernel.build` returns None and why where it cannot be built
or does not agree with torch on a check product: products then stay torch's.

`install` has a module tree's plain float32 `nn.Linear` modules compute through the kernel
inside `active()` on the calling thread (a server's session steps, the SDK's generate()) where
it `takes` the product (1 to MAX_ROWS rows: decode steps and prompts of a few tokens; CPU,
contiguous weight, no gradient, not inside torch.compile); any other call goes to F.linear as
before. /forward and /backward stay on torch's BLAS: they score and train whole sequences,
and their logits are what users compare with transformers. The kernel sums in another order
than MKL (closer to float64's sums than MKL's on SmolLM2), so a session step's logits agree
with transformers' within float rounding, as a batched step's always did; greedy tokens are
the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from drift.models.rows import Product

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("row_kernel.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
MAX_ROWS = 8  # rows a product may have to run on the kernel (more: torch's BLAS)
CHECK_TOLERANCE = 1e-4  # the check product's largest difference from torch's


class RowKernel:
    """The built kernel, loaded: `linear` like F.linear, `install` into modules."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._on = threading.local()  # depth of `active()` on each thread
        self._rows = library.drift_rows
        self._rows.restype = None
        self._rows.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3 + [ctypes.c_int]
        lanes = library.drift_rows_lanes
        lanes.restype = ctypes.c_int
        self.lanes = int(lanes())  # floats per vector register the build uses

    @classmethod
    def build(cls, cache_dir: Path,
              environ: Mapping[str, str] = os.environ) -> tuple[RowKernel | None, str]:  # fmt: skip
        """(the kernel, or None; a line saying which build, or why none), compiling it into
        `cache_dir`/kernels unless that holds this source's build for this compiler and CPU."""
        if sys.platform != "linux":
            return None, "built on Linux only: torch's BLAS runs the products"
        where = environ.get("PATH")
        compiler = (
            environ.get("CC") or shutil.which("cc", path=where) or shutil.which("gcc", path=where)
        )
        if not compiler:
            return None, ("no C compiler on PATH (install gcc, or set CC): torch's BLAS runs "
                          "the products, ~1.5-2x slower in decode steps")  # fmt: skip
        try:
            version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.partition("\n")[0]  # fmt: skip
            path = _built(compiler, version, cache_dir / "kernels")
            kernel = cls(ctypes.CDLL(str(path)), path)
        except (OSError, subprocess.SubprocessError, RuntimeError) as err:
            return None, f"the C kernel did not build ({err}): torch's BLAS runs the products"
        error = kernel.check()
        if error > CHECK_TOLERANCE:
            return None, (f"the C kernel's check product differed from torch's by {error:.2e}: "
                          "torch's BLAS runs the products")  # fmt: skip
        return kernel, f"DRIFT's row kernel ({kernel.lanes} floats a vector, {version})"

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside, the calling thread's products through installed modules (and `product`)
        run on the kernel where it takes them."""
        depth = getattr(self._on, "depth", 0)
        self._on.depth = depth + 1
        try:
            yield
        finally:
            self._on.depth = depth

    def product(self, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """`linear` inside `active()` on this thread, else F.linear."""
        if getattr(self._on, "depth", 0):
            return self.linear(x, weight, bias)
        return torch.nn.functional.linear(x, weight, bias)

    def takes(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether the kernel computes F.linear(x, weight, bias): float32 on the CPU, 1 to
        MAX_ROWS rows, a contiguous [out, in] weight, nothing that needs a gradient, not
        traced by torch.compile."""
        width = x.shape[-1] if x.dim() else 0
        return (
            x.dtype == torch.float32
            and weight.dtype == torch.float32
            and x.device.type == "cpu"
            and weight.device.type == "cpu"
            and weight.dim() == 2
            and weight.is_contiguous()
            and width == weight.shape[1]
            and width > 0
            and 0 < x.numel() // width <= MAX_ROWS
            and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"
                                  and bias.dim() == 1 and bias.is_contiguous()))  # fmt: skip
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad)))
            and not torch.compiler.is_compiling()
        )  # fmt: skip

    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """F.linear(x, weight, bias), on the kernel where it `takes` the product, on the
        calling thread's torch thread count."""
        if not self.takes(x, weight, bias):
            return torch.nn.functional.linear(x, weight, bias)
        width, out = int(x.shape[-1]), int(weight.shape[0])
        rows = x.numel() // width
        flat = x.reshape(rows, width).contiguous()
        y = torch.empty(rows, out, dtype=torch.float32)
        self._rows(weight.data_ptr(), flat.data_ptr(), y.data_ptr(),
                   None if bias is None else bias.data_ptr(), rows, width, out,
                   torch.get_num_threads())  # fmt: skip
        return y.reshape(*x.shape[:-1], out)

    def check(self) -> float:
        """The largest difference from F.linear over a few shapes (odd widths, tails, bias)."""
        gen = torch.Generator().manual_seed(0)
        worst = 0.0
        with torch.no_grad():
            for rows, width, out in ((1, 576, 67), (3, 100, 9), (5, 37, 130), (8, 1024, 64)):
                x = torch.randn(rows, width, generator=gen)
                w = torch.randn(out, width, generator=gen) / width**0.5
                b = torch.randn(out, generator=gen)
                for bias in (None, b):
                    want = torch.nn.functional.linear(x, w, bias)
                    worst = max(worst, float((self.linear(x, w, bias) - want).abs().max()))
        return worst

    def install(self, root: torch.nn.Module) -> int:
        """Have `root`'s plain float32 CPU `nn.Linear` modules (not subclasses: quantized
        ones are) compute through `product`; their type, parameters and hooks stay. Returns
        how many."""
        count = 0
        for module in root.modules():
            weight = getattr(module, "weight", None)
            if (type(module) is torch.nn.Linear and weight is not None
                    and weight.dtype == torch.float32 and weight.device.type == "cpu"):  # fmt: skip
                module.forward = _Forward(self, module)
                count += 1
        return count

    def __reduce__(self) -> tuple[object, tuple[str]]:
        """Pickled (a whole model saved) as its library's path: loaded again there, or
        torch's BLAS where that path holds no build."""
        return _reload, (str(self.path),)

    def __deepcopy__(self, memo: dict[int, object]) -> RowKernel:
        return self  # nothing in it changes: a copied model shares it


class _Forward:
    """nn.Linear.forward through a row kernel (RowKernel.install)."""

    def __init__(self, kernel: RowKernel | None, module: torch.nn.Linear) -> None:
        self.kernel, self.module = kernel, module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        if self.kernel is None:
            return torch.nn.functional.linear(x, module.weight, module.bias)
        return self.kernel.product(x, module.weight, module.bias)


def _reload(path: str) -> RowKernel | None:
    try:
        return RowKernel(ctypes.CDLL(path), Path(path))
    except OSError:
        return None


def install_built(root: torch.nn.Module, cache_dir: Path,
                  environ: Mapping[str, str] = os.environ) -> tuple[int | None, str]:  # fmt: skip
    """Build the kernel into `cache_dir` (RowKernel.build) and `install` it in `root`, as a
    server's span and the SDK's head do: (how many modules compute on it, the build's line),
    or (None, why no kernel was built)."""
    kernel, why = RowKernel.build(cache_dir, environ)
    return (None, why) if kernel is None else (kernel.install(root), why)


def kernel_in(root: torch.nn.Module) -> RowKernel | None:
    """The kernel `install` put in some module of `root`, if any."""
    for module in root.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, _Forward) and forward.kernel is not None:
            return forward.kernel
    return None


def activated(kernel: RowKernel | None) -> contextlib.AbstractContextManager[None]:
    """`kernel.active()`, or nothing where there is no kernel."""
    return kernel.active() if kernel is not None else contextlib.nullcontext()


def product_of(module: torch.nn.Module) -> Product:
    """How `module`'s products are computed: its kernel's `product`, else F.linear."""
    forward = module.__dict__.get("forward")
    if isinstance(forward, _Forward) and forward.kernel is not None:
        return forward.kernel.product
    return torch.nn.functional.linear


def _built(compiler: str, version: str, directory: Path) -> Path:
    """The library for this source, compiler and CPU in `directory`, compiled there first
    (into a temporary name, then renamed: servers starting together never load half a
    file) unless it is there."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), version.encode(),
                                     " ".join(FLAGS).encode(), _cpu().encode()])).hexdigest()  # fmt: skip
    path = directory / f"row_kernel-{key[:16]}.so"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".row_kernel-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{compiler} exited {done.returncode}: {last}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built the row kernel: %s", path)
    return path


def _cpu() -> str:
    """What -march=native builds for: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    lines = [line for line in info.splitlines() if line.split(":")[0].strip() in wanted]
    return platform.machine() + "\n" + "\n".join(sorted(set(lines)))
