"""A box machine's server that outgrows its memory: the kernel's OOM killer ends it, and
`drift down --list` run on that machine says so (issue 25: a server killed by the kernel
anyway is reported as such). `drift server` with explicit blocks does not size itself by
its budget (`drift up` does), so it is started past it on purpose, in the machine's own
memory cgroup (tests/cluster/box.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster.box import Box

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_a_server_the_kernel_kills_is_reported_as_killed_by_it(box_ok, box_model: Path,
                                                               tmp_path: Path) -> None:  # fmt: skip
    # 0.5 GiB: the process itself (~0.3 GiB) starts and records itself; the 12 float32
    # blocks (26.5 MiB each) do not fit beside it
    with Box(1, tmp_path, memory=int(0.5 * 2**30)) as box:
        machine = box.machines[0]
        server = machine.run(["server", str(box_model), "--device", "cpu", "--num_blocks", "12"])
        code = server.popen.wait(timeout=240)
        assert code == -9, f"exit {code}, not killed:\n{server.output()[-3000:]}"
        assert machine.oom_kills() >= 1
        listing = machine.run(["down", "--list"])
        assert listing.popen.wait(timeout=120) == 0, listing.output()
        text = listing.output()
        assert re.search(r"killed by the kernel: out of memory \(an OOM kill in its memory "
                         r"cgroup", text), text  # fmt: skip
