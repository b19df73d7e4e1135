"""The memory budget reader: fake cgroup v1 / v2 trees, a real cgroup v1 where root allows,
--max_memory (flag, env, config file), and the smallest figure winning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drift.cli._budget import (
    Budget,
    Figure,
    cgroup_figures,
    parse_size,
    read_budget,
)

GiB = 1 << 30
MiB = 1 << 20


def _tree(root: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
)
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroup_v1_limit_minus_usage_not_counting_page_cache(tmp_path: Path) -> None:
    m = "sys/fs/cgroup/memory"
    root = _tree(tmp_path, "4:memory:/drift/m1\n1:cpu:/\n", V1_MOUNTS, {
        f"{m}/memory.limit_in_bytes": "9223372036854771712\n",  # the root: unlimited
        f"{m}/drift/memory.limit_in_bytes": str(8 * GiB),
        f"{m}/drift/memory.usage_in_bytes": str(1 * GiB),
        f"{m}/drift/m1/memory.limit_in_bytes": str(3 * GiB),
        f"{m}/drift/m1/memory.usage_in_bytes": str(700 * MiB),
        f"{m}/drift/m1/memory.stat": f"cache 300\ntotal_inactive_file {200 * MiB}\n",
    })  # fmt: skip
    (fig,) = cgroup_figures(root)
    assert fig.available == 3 * GiB - 500 * MiB
    assert fig.source == f"cgroup v1 {root / m / 'drift/m1'}"
    assert "memory.limit_in_bytes 3.00 GiB" in fig.detail


def test_cgroup_v1_a_parent_tighter_than_the_child_wins(tmp_path: Path) -> None:
    m = "sys/fs/cgroup/memory"
    root = _tree(tmp_path, "4:memory:/pod/c\n", V1_MOUNTS, {
        f"{m}/pod/memory.limit_in_bytes": str(2 * GiB),
        f"{m}/pod/memory.usage_in_bytes": str(1536 * MiB),  # a sibling uses most of it
        f"{m}/pod/c/memory.limit_in_bytes": str(3 * GiB),
        f"{m}/pod/c/memory.usage_in_bytes": str(100 * MiB),
    })  # fmt: skip
    (fig,) = cgroup_figures(root)
    assert fig.available == 512 * MiB and fig.source.endswith("/pod")


def test_cgroup_v2_memory_max(tmp_path: Path) -> None:
    c = "sys/fs/cgroup"
    root = _tree(tmp_path, "0::/system.slice/drift.service\n", V2_MOUNTS, {
        f"{c}/system.slice/memory.max": "max\n",
        f"{c}/system.slice/drift.service/memory.max": str(1536 * MiB),
        f"{c}/system.slice/drift.service/memory.current": str(400 * MiB),
        f"{c}/system.slice/drift.service/memory.stat": f"anon 1\ninactive_file {100 * MiB}\n",
    })  # fmt: skip
    (fig,) = cgroup_figures(root)
    assert fig.available == 1236 * MiB and fig.source.startswith("cgroup v2 ")
    assert "memory.max 1.50 GiB" in fig.detail


def test_cgroup_v2_unlimited_and_container_without_cgroup_namespace(tmp_path: Path) -> None:
    c = "sys/fs/cgroup"
    # Docker without cgroupns: /proc/self/cgroup names the host path, the mount is the container's
    root = _tree(tmp_path / "a", "0::/docker/abc123\n", V2_MOUNTS, {
        f"{c}/memory.max": str(3 * GiB), f"{c}/memory.current": str(GiB),
    })  # fmt: skip
    (fig,) = cgroup_figures(root)
    assert fig.available == 2 * GiB
    root = _tree(tmp_path / "b", "0::/user.slice\n", V2_MOUNTS, {
        f"{c}/user.slice/memory.max": "max\n", f"{c}/user.slice/memory.current": "5",
    })  # fmt: skip
    assert cgroup_figures(root) == []
    assert cgroup_figures(tmp_path / "nothing-here") == []  # no /proc (macOS, Windows)


def test_the_smallest_figure_wins_and_is_named(tmp_path: Path, monkeypatch) -> None:
    m = "sys/fs/cgroup/memory"
    root = _tree(tmp_path, "4:memory:/m1\n", V1_MOUNTS, {
        f"{m}/m1/memory.limit_in_bytes": str(3 * GiB), f"{m}/m1/memory.usage_in_bytes": "0",
    })  # fmt: skip
    budget = read_budget(torch.device("cpu"), root=root)
    assert [f.source.split()[0] for f in budget.figures] == ["cgroup", "host"]
    assert budget.available == min(3 * GiB, budget.figures[1].available)
    if budget.figures[1].available > 3 * GiB:
        assert budget.explain().startswith("budget 3.00 GiB from cgroup v1 ")
        assert "also read: host MemAvailable" in budget.explain()
    from drift.models.memory import resident_bytes

    # --max_memory is a share of the machine for the whole process: what this process already
    # holds (large late in a full test run) is taken off it
    share = (resident_bytes() or 0) + GiB
    small = read_budget(torch.device("cpu"), root=root, max_memory=share)
    assert small.chosen.source == "--max_memory"
    assert small.available == pytest.approx(GiB, abs=64 * MiB)
    assert Budget((Figure("a", -5, "x"),)).available == 0


def test_accelerator_budget_is_its_free_memory(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (5 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 256 * MiB)
    budget = read_budget(torch.device("cuda:1"))
    assert budget.chosen.source == "cuda:1 free memory" and budget.available == 5 * GiB
    budget = read_budget(torch.device("cuda:1"), max_memory=2 * GiB)
    assert budget.available == 2 * GiB - 256 * MiB and budget.chosen.source == "--max_memory"


@pytest.mark.parametrize("text, n", [("3GiB", 3 * GiB), ("3g", 3 * GiB), ("1.5 GiB", 1536 * MiB),
                                     ("2GB", 2 * 10**9), ("1536MiB", 1536 * MiB), ("2e9", 2 * 10**9),
                                     ("4096", 4096), ("512m", 512 * MiB)])  # fmt: skip
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "lots", "3 parsecs", "-1G", "0"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_max_memory_from_flag_env_and_config(tmp_path: Path) -> None:
    from drift.cli.main import parse_args

    (tmp_path / "drift.toml").write_text('[up]\nmax_memory = "2GiB"\n')
    env = {"HOME": str(tmp_path), "DRIFT_CONFIG": str(tmp_path / "drift.toml")}
    assert parse_args(["up"], {"HOME": str(tmp_path)}).max_memory is None
    assert parse_args(["up"], env).max_memory == 2 * GiB
    env["DRIFT_MAX_MEMORY"] = "1g"
    assert parse_args(["up"], env).max_memory == GiB
    assert parse_args(["up", "--max_memory", "512MiB"], env).max_memory == 512 * MiB


V1_ROOT = Path("/sys/fs/cgroup/memory")
CHILD = """
import sys, torch
from drift.cli._budget import read_budget
sys.stdin.readline()  # moved into the cgroup by the test
print(read_budget(torch.device("cpu")).chosen.available, read_budget(torch.device("cpu")).chosen.source)
"""


def test_a_real_cgroup_v1_limit_is_read() -> None:
    """Root with a cgroup v1 memory hierarchy (this CI host): a child in a 768 MiB cgroup."""
    if os.geteuid() != 0 or not (V1_ROOT / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
    group = V1_ROOT / f"drift-test-budget-{os.getpid()}"
    group.mkdir()
    child = None
    try:
        (group / "memory.limit_in_bytes").write_text(str(768 * MiB))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        (group / "cgroup.procs").write_text(str(child.pid))
        out, _ = child.communicate("go\n", timeout=120)
        available, source = out.split(maxsplit=1)
        assert source.strip() == f"cgroup v1 {group}"
        assert 0 < int(available) < 768 * MiB
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        group.rmdir()
