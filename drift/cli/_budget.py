"""How much memory this process may still take: the smallest of every limit that applies.

The figures: the memory cgroup this process is in (v2 `memory.max - memory.current`, v1
`memory.limit_in_bytes - memory.usage_in_bytes`, over its cgroup and every parent up to the
mount; reclaimable page cache, `inactive_file`, is not counted as used), the host's
MemAvailable (psutil), an accelerator's free memory (`torch.cuda.mem_get_info`), and
--max_memory (a share of the machine: that many bytes for this process in all, less what it
already holds). The cgroup is found through /proc/self/cgroup and /proc/self/mountinfo, so a
container (Docker `--memory`, Kubernetes limits), a systemd `MemoryMax` and a hand-made
cgroup are all seen. `root` lets tests point the reader at a fake file tree.
Knows nothing about models.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNLIMITED = 1 << 60  # v1 writes 'no limit' as a number near 2**63
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20,
          "mb": 10**6, "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40,
          "tb": 10**12}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'3GiB', '3g' (binary, as Docker), '3GB' (decimal), '1536MiB', '2e9'... -> bytes."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if unit.endswith("b") and unit not in _UNITS:
        unit = unit[:-1]
    if m is None or unit not in _UNITS:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"not a memory size: {text!r} (e.g. 3GiB, 1536MiB, 2GB)") from None
        return _positive(int(value), text)
    return _positive(int(float(m.group(1)) * _UNITS[unit]), text)


def _positive(n: int, text: str) -> int:
    if n <= 0:
        raise ValueError(f"a memory size must be positive: {text!r}")
    return n


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


@dataclass(frozen=True)
class Figure:
    """One limit: what it is called, and the bytes it leaves this process."""

    source: str  # e.g. "cgroup v1 /sys/fs/cgroup/memory/drift/m1"
    available: int  # bytes this process may still allocate under this limit
    detail: str  # how `available` was found, for the startup message


@dataclass(frozen=True)
class Budget:
    figures: tuple[Figure, ...]  # never empty: the host's memory is always a figure

    @property
    def chosen(self) -> Figure:
        return min(self.figures, key=lambda f: f.available)

    @property
    def available(self) -> int:
        return max(0, self.chosen.available)

    def explain(self) -> str:
        c = self.chosen
        others = [f"{f.source} {gib(f.available)}" for f in self.figures if f is not c]
        rest = f" (also read: {'; '.join(others)})" if others else ""
        return f"budget {gib(max(0, c.available))} from {c.source}: {c.detail}{rest}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: Path) -> int | None:
    text = _read(path)
    if text is None or text == "max":
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


@dataclass(frozen=True)
class _Mount:
    root: str  # the part of the hierarchy mounted here
    point: Path  # where it is mounted (under `root` of the reader)
    fstype: str
    options: frozenset[str]  # super options: for cgroup v1 the controllers


def _mounts(root: Path, pid: str) -> list[_Mount]:
    out = []
    for line in (_read(root / "proc" / pid / "mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        point = root / fields[4].replace("\\040", " ").lstrip("/")
        out.append(_Mount(fields[3], point, tail[0], frozenset(tail[2].split(","))))
    return out


def _cgroup_dir(mount: _Mount, path: str) -> Path:
    """The directory of cgroup `path` under `mount`; the mount itself when the path is not
    visible there (a container without its own cgroup namespace sees the host's path)."""
    rel = os.path.relpath(path, mount.root) if path.startswith(mount.root) else path
    rel = rel.lstrip("/") if rel != "." else ""
    candidate = mount.point / rel if rel and not rel.startswith("..") else mount.point
    return candidate if candidate.is_dir() else mount.point


def _walk_up(start: Path, stop: Path) -> list[Path]:
    dirs = [start]
    while dirs[-1] != stop and stop in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def cgroup_figures(root: Path = Path("/"), pid: str = "self") -> list[Figure]:
    """The memory limits of the cgroups (v1 and v2) process `pid` is in: one figure per
    version, the tightest level of its hierarchy (empty when nothing is limited)."""
    lines = (_read(root / "proc" / pid / "cgroup") or "").splitlines()
    mounts = _mounts(root, pid)
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, controllers, path = parts
        if controllers == "":  # v2: "0::/path"
            mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
            if mount is not None:
                out += _tightest(mount, path, v2=True)
        elif "memory" in controllers.split(","):
            mount = next((m for m in mounts if m.fstype == "cgroup" and "memory" in m.options),
                         None)  # fmt: skip
            if mount is not None:
                out += _tightest(mount, path, v2=False)
    return out


def _tightest(mount: _Mount, path: str, *, v2: bool) -> list[Figure]:
    best: Figure | None = None
    limit_name, usage_name = ("memory.max", "memory.current") if v2 else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes")  # fmt: skip
    inactive = "inactive_file" if v2 else "total_inactive_file"
    for d in _walk_up(_cgroup_dir(mount, path), mount.point):
        limit = _number(d / limit_name)
        if limit is None or limit >= UNLIMITED:
            continue
        usage = _number(d / usage_name) or 0
        cache = min(usage, _stat(d / "memory.stat", inactive))
        used = usage - cache
        fig = Figure(f"cgroup {'v2' if v2 else 'v1'} {d}", limit - used,
                     f"{limit_name} {gib(limit)} - {gib(used)} in use")  # fmt: skip
        if best is None or fig.available < best.available:
            best = fig
    return [best] if best is not None else []


def host_figure() -> Figure:
    import psutil

    avail = int(psutil.virtual_memory().available)  # Linux's MemAvailable; macOS, Windows too
    return Figure("host MemAvailable", avail, f"{gib(avail)} available on this machine")


def accelerator_figure(device: Any) -> Figure | None:
    """Free memory of a CUDA / XPU device, or None for a CPU (or an unreadable device)."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
    elif device.type == "xpu" and hasattr(torch.xpu, "mem_get_info"):
        free, total = torch.xpu.mem_get_info(device)
    else:
        return None
    return Figure(f"{device} free memory", int(free), f"{gib(free)} free of {gib(total)}")


def max_memory_figure(max_memory: int, in_use: int, what: str) -> Figure:
    return Figure("--max_memory", max_memory - in_use,
                  f"--max_memory {gib(max_memory)} - {gib(in_use)} {what}")  # fmt: skip


def read_budget(device: Any, *, max_memory: int | None = None, root: Path = Path("/")) -> Budget:
    """Every figure that limits `device`: on a CPU the cgroups and the host; on an accelerator
    its free memory; --max_memory on either (less this process's RSS, or what torch holds on
    the accelerator)."""
    accel = accelerator_figure(device)
    if accel is not None:
        figures = [accel]
        if max_memory is not None:
            import torch

            held = int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else 0
            figures.append(max_memory_figure(max_memory, held, f"held on {device}"))
        return Budget(tuple(figures))
    figures = [*cgroup_figures(root), host_figure()]
    if max_memory is not None:
        from drift.models.memory import resident_bytes

        figures.append(max_memory_figure(max_memory, resident_bytes() or 0, "this process holds"))
    return Budget(tuple(figures))


def oom_kill_counts(root: Path = Path("/"), pid: str = "self") -> dict[str, int]:
    """The kernel's OOM-kill counters that cover process `pid`: the host's (/proc/vmstat) and
    its memory cgroups' (v1 memory.oom_control, v2 memory.events), by name; empty off Linux."""
    out: dict[str, int] = {}
    for line in (_read(root / "proc/vmstat") or "").splitlines():
        if line.startswith("oom_kill "):
            out["host"] = int(line.split()[1])
    mounts = _mounts(root, pid)
    for line in (_read(root / "proc" / pid / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        v2 = parts[1] == ""
        if not v2 and "memory" not in parts[1].split(","):
            continue
        fits = [m for m in mounts if (m.fstype == "cgroup2" if v2 else
                                      m.fstype == "cgroup" and "memory" in m.options)]  # fmt: skip
        if not fits:
            continue
        d = _cgroup_dir(fits[0], parts[2])
        events = d / ("memory.events" if v2 else "memory.oom_control")
        if events.exists():
            out[str(d)] = _stat(events, "oom_kill")
    return out


def oom_kills_now(names: list[str], root: Path = Path("/")) -> dict[str, int]:
    """The current values of counters named by `oom_kill_counts` (of another, maybe dead,
    process): 'host', or a cgroup directory; a counter no longer readable is left out."""
    out: dict[str, int] = {}
    for name in names:
        if name == "host":
            out.update({k: v for k, v in oom_kill_counts(root, "self").items() if k == "host"})
            continue
        for events in (Path(name) / "memory.oom_control", Path(name) / "memory.events"):
            if events.exists():
                out[name] = _stat(events, "oom_kill")
    return out
